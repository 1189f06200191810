//! Services as egress policy sees them. A pod sends to a ClusterIP; the
//! node's kube-proxy rewrites it to a backend only after flatnet's
//! `from_pod` has judged the packet. Kubernetes' own tests judge egress
//! against the backend (a Service as destination is allowed exactly when
//! its backend is), so the plan turns backends into ClusterIP entries: a
//! Service port is allowed through its ClusterIP when every one of its
//! backends is allowed on its target port. A Service with some backends
//! allowed and others not stays denied through its ClusterIP (kube-proxy
//! would pick one at random; allowing it would let the pod reach backends
//! its policy denies), and its allowed backends remain reachable directly.

use ipnetwork::IpNetwork;

use super::ports::{PortRange, PortSet};
use super::table::{Allow, Table};
use crate::services::Frontend;

/// The ClusterIP entries an egress `table` earns: for each Service port
/// and ClusterIP, that port when the table allows every backend of the
/// ClusterIP's family (kube-proxy translates within a family) on its target
/// port, and there is at least one.
pub fn cluster_ip_allows<'a>(table: &Table, frontends: &[Frontend<'a>]) -> Vec<Allow<'a>> {
    let mut out = Vec::new();
    for frontend in frontends {
        for port in &frontend.ports {
            for ip in &frontend.cluster_ips {
                let mut backends = port.backends_for(*ip).peekable();
                if backends.peek().is_none()
                    || !backends.all(|(backend, target)| {
                        table.allows(*backend, port.protocol.number(), *target)
                    })
                {
                    continue;
                }
                let Ok(cidr) = IpNetwork::new(*ip, if ip.is_ipv4() { 32 } else { 128 }) else {
                    continue;
                };
                out.push(Allow {
                    cidr,
                    except: Vec::new(),
                    ports: PortSet::of([PortRange::new(port.protocol, port.port, port.port)]),
                    policy: frontend.name,
                });
            }
        }
    }
    out
}
