//! The kubelet's probes: `GET /health` (the process serves) and
//! `GET /ready` (the Services and EndpointSlices have been listed, so answers
//! are complete; 503 before).

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::error::ServerError;
use crate::server::SnapshotReceiver;

/// The probe routes, reading readiness from the DNS server's snapshot.
pub fn router(snapshots: SnapshotReceiver) -> Router {
    Router::new()
        .route("/health", get(|| async { (StatusCode::OK, "ok\n") }))
        .route("/ready", get(ready))
        .with_state(snapshots)
}

async fn ready(State(snapshots): State<SnapshotReceiver>) -> (StatusCode, &'static str) {
    if snapshots.borrow().is_synced() {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "Services and EndpointSlices not listed yet\n",
        )
    }
}

/// Serves the probes on `listener` until it fails.
pub async fn serve(listener: TcpListener, snapshots: SnapshotReceiver) -> Result<(), ServerError> {
    axum::serve(listener, router(snapshots))
        .await
        .map_err(ServerError::Health)
}
