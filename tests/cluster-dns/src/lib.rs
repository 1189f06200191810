//! flatnet-cluster-dns: the cluster DNS server of flatnet's real-cluster
//! e2e harness (kubelet + containerd + kube-proxy, flatnet as CNI). It
//! stands in for CoreDNS, which is not packaged in Debian and whose Go
//! modules cannot be fetched here, and serves what the upstream e2e tests
//! ask of cluster DNS: the Kubernetes DNS-based service
//! discovery specification (github.com/kubernetes/dns,
//! docs/specification.md), shaped like CoreDNS's `kubernetes` plugin in
//! `pods insecure` mode.
//!
//! It watches core/v1 Services and discovery.k8s.io/v1 EndpointSlices
//! cluster-wide (a Service's slices found by their
//! `kubernetes.io/service-name` label and merged, as CoreDNS's kubernetes
//! plugin finds them; an endpoint ready unless its `conditions.ready` is
//! false) and serves, over UDP and TCP:
//!
//! - `<svc>.<ns>.svc.<zone>`: A/AAAA, the ClusterIP(s) of ClusterIP,
//!   NodePort and LoadBalancer services; the ready endpoint addresses of
//!   headless services (NXDOMAIN with none); a CNAME to `spec.externalName`
//!   for ExternalName services (followed only when it points into the
//!   zone).
//! - `<endpoint>.<svc>.<ns>.svc.<zone>`: A/AAAA of one ready endpoint,
//!   named by its `hostname`, else by its address with dashes
//!   (`10-244-1-5`, `fd00--5`).
//! - SRV at `_<port>._<proto>.<svc>.<ns>.svc.<zone>` for named ports and at
//!   `<svc>.<ns>.svc.<zone>` for every port; the target is the service
//!   (ClusterIP) or each ready endpoint (headless), with the targets'
//!   addresses in the additional section.
//! - `<a-b-c-d>.<ns>.pod.<zone>` (and the IPv6 form with dashes): A/AAAA of
//!   the address the name spells; pods are not watched.
//! - PTR in in-addr.arpa. and ip6.arpa. for every ClusterIP (its service)
//!   and every ready endpoint address (its endpoint names).
//! - TXT `dns-version.<zone>`: the schema version, "1.1.0".
//! - SOA at each zone apex, and in the authority section of NXDOMAIN (an
//!   unknown name) and NODATA (a known name without the asked type).
//!
//! Anything outside the cluster zone and the reverse zones is REFUSED. It
//! never forwards a query nor contacts any DNS server: there is no
//! upstream, by design (the harness has no network beyond the machine).
//!
//! The parts: [`snapshot`] turns Services and EndpointSlices into the names of
//! the zones; [`resolver`] answers a question from a snapshot (pure, unit
//! tested); [`server`] serves it with hickory; [`kube_watch`] feeds it
//! snapshots from the API server; [`health`] answers the probes.
//!
//! # The CoreDNS mode
//!
//! Upstream's agnhost image (the e2e suite's utility image) carries the
//! CoreDNS binary as `/coredns`, and "[sig-network] DNS should support
//! configurable pod resolv.conf" (and the `dns_configmap.go` tests) run it
//! as a pod's DNS server: `/coredns -conf /etc/coredns/Corefile`, the
//! Corefile from a ConfigMap of this shape (`generateCoreDNSConfigmap` in
//! `test/e2e/network/dns_common.go`):
//!
//! ```text
//! . {
//!     hosts {
//!         1.1.1.1 notexistname.resolv.conf.local
//!     }
//!     log
//! }
//! ```
//!
//! flatnet's agnhost image ships this binary as `/coredns` in its stead
//! (xtask/src/e2e/images/). Called `coredns`, or with `-conf FILE` /
//! `--conf FILE` / `-conf=FILE` (Go's flag syntax, as CoreDNS reads it),
//! it does no Kubernetes work: it reads the Corefile and serves it
//! ([`coredns`]; the parser is [`corefile`], the answers [`hosts`], the
//! serving the same [`server`] as the cluster's). Exactly this is
//! supported, anything else is refused at start with the line at fault
//! and what is supported, and a non-zero exit:
//!
//! - Server blocks `ZONE[:PORT] { ... }`, one zone each (`.` is every
//!   name; any case, a trailing dot optional), port 53 by default, several
//!   blocks (on one port a question goes to the block of the longest zone
//!   holding its name); no transport prefix (`dns://`), no CIDR keys, no
//!   blocks without braces. `{` ends the line that opens a block, `}`
//!   stands alone on its line. `#` comments and blank lines.
//! - `hosts { ... }`: one `IP NAME [NAME...]` entry a line (an address
//!   IPv4 or IPv6, without `%zone`), and an optional bare `fallthrough`
//!   (accepted, but it changes no answer: nothing follows hosts here;
//!   CoreDNS would hand an unknown name to no next plugin and answer
//!   SERVFAIL, this answers NXDOMAIN). No hosts file (CoreDNS's `hosts`
//!   also reads /etc/hosts, or the file it is given: not here), no zones,
//!   `ttl`, `reload` or `no_reverse`; a malformed entry is an error where
//!   CoreDNS skips it.
//! - `log`: one line per query on stderr, in the shape of CoreDNS's
//!   (`{remote} - {id} "{type} {class} {name} {proto} {size} {do}
//!   {bufsize}" {rcode} {flags} {duration}`, no response size), no
//!   arguments.
//! - `errors`: accepted, nothing to do.
//! - The command line: `-conf FILE` and `-help` only (no `-dns.port`,
//!   no `-version`); called `coredns` without `-conf` is an error (CoreDNS
//!   would look for ./Corefile).
//!
//! The answers, as CoreDNS's hosts plugin gives them: A and AAAA for the
//! entries' names (without case, asked absolute or not), PTR at the
//! reverse name of each entry's address (in-addr.arpa. or ip6.arpa.,
//! when that name is in the block's zone, as with `.`) to each name it
//! has, all with TTL 3600 and the AA bit; NOERROR without records (NODATA)
//! for such a name asked another type (ANY included); NXDOMAIN for any
//! other name in the zone (no SOA: the hosts plugin has none); REFUSED
//! outside every zone (an entry outside its block's zone is never
//! answered), for classes other than IN and for zone transfers.
//! It never forwards a query. It listens on UDP and TCP at `[::]:PORT`
//! (IPv4 too), or `0.0.0.0:PORT` on a host without IPv6.

pub mod coredns;
pub mod corefile;
pub mod error;
pub mod health;
pub mod hosts;
pub mod kube_watch;
pub mod resolver;
pub mod server;
mod slices;
pub mod snapshot;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use corefile::Corefile;
pub use error::RunError;
pub use hosts::HostsResolver;
pub use resolver::Answer;
pub use server::{DnsServer, Resolve, SnapshotReceiver};
pub use snapshot::{ClusterSnapshot, DNS_SCHEMA_VERSION, ZoneConfig};

use error::ServerError;

/// `flatnet-cluster-dns [--listen ADDR] [--zone ZONE] ...`
#[derive(Debug, Parser)]
#[command(
    version,
    about = "Cluster DNS for flatnet's e2e harness (in place of CoreDNS; never forwards)"
)]
pub struct Args {
    /// Where DNS is served, on UDP and TCP.
    #[arg(long, env = "CLUSTER_DNS_LISTEN", default_value = "0.0.0.0:53")]
    pub listen: SocketAddr,

    /// The cluster domain (kubelet's --cluster-domain).
    #[arg(long, env = "CLUSTER_DNS_ZONE", default_value = "cluster.local")]
    pub zone: String,

    /// The TTL of the records, in seconds (CoreDNS's default).
    #[arg(long, env = "CLUSTER_DNS_TTL", default_value_t = 5)]
    pub ttl: u32,

    /// Where `GET /health` and `GET /ready` are served (HTTP).
    #[arg(
        long,
        env = "CLUSTER_DNS_HEALTH_LISTEN",
        default_value = "0.0.0.0:8080"
    )]
    pub health_listen: SocketAddr,

    /// A kubeconfig to use; without it, kube's usual order: KUBECONFIG,
    /// ~/.kube/config, then the in-cluster service account.
    #[arg(long, env = "CLUSTER_DNS_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Log filter (tracing's EnvFilter syntax). hickory logs every query at
    /// info, hence its warn.
    #[arg(
        long,
        env = "CLUSTER_DNS_LOG",
        default_value = "info,hickory_server=warn"
    )]
    pub log: String,
}

async fn kube_client(kubeconfig: Option<&PathBuf>) -> Result<kube::Client, RunError> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await?
        }
        None => kube::Config::infer().await?,
    };
    Ok(kube::Client::try_from(config)?)
}

/// Waits for SIGTERM (the kubelet stopping the pod) or SIGINT.
pub(crate) async fn shutdown_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = terminate.recv() => {}
        result = tokio::signal::ctrl_c() => result?,
    }
    Ok(())
}

/// Serves DNS and the probes, fed by the watches, until a signal or a
/// failure.
pub async fn run(args: Args) -> Result<(), RunError> {
    let config = ZoneConfig::new(&args.zone, args.ttl)?;
    let (snapshot_sender, snapshots) =
        watch::channel(Arc::new(ClusterSnapshot::unsynced(config.clone())));
    // Listen first: the liveness probe holds while the API server is slow.
    let dns = DnsServer::bind(args.listen, snapshots.clone()).await?;
    let health_listener = TcpListener::bind(args.health_listen)
        .await
        .map_err(|source| ServerError::Bind {
            protocol: "TCP",
            addr: args.health_listen,
            source,
        })?;
    let health_addr = health_listener
        .local_addr()
        .map_err(ServerError::LocalAddr)?;
    tracing::info!(
        listen = %dns.local_addr(),
        health = %health_addr,
        zone = %config.zone(),
        ttl = config.ttl(),
        "serving DNS (no upstream: other names are refused)"
    );
    let client = kube_client(args.kubeconfig.as_ref()).await?;
    tokio::select! {
        result = dns.run() => result?,
        result = health::serve(health_listener, snapshots) => result?,
        result = kube_watch::run(client, config, snapshot_sender) => result?,
        result = shutdown_signal() => {
            result.map_err(RunError::Signal)?;
            tracing::info!("stopping on signal");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
