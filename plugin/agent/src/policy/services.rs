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
//!
//! The other way round too: an ipBlock that happens to contain a ClusterIP
//! (`0.0.0.0/4` except one pod's address) does not allow that ClusterIP by
//! itself, or the pod would reach the excepted backend through its
//! Service. Such a ClusterIP is withheld from the ipBlock (an `except` of
//! its own) unless the table allows every backend of every port of it.

use std::collections::HashMap;
use std::net::IpAddr;

use ipnetwork::IpNetwork;

use super::ports::{PortRange, PortSet};
use super::table::{Allow, Table};
use crate::services::Frontend;

/// An egress table and the identity of every peer address: enough to say
/// whether the table allows a backend.
pub type Backends<'t> = (&'t Table, &'t HashMap<IpAddr, u32>);

fn allows_backend(
    (table, addresses): Backends<'_>,
    backend: IpAddr,
    protocol: u8,
    port: u16,
) -> bool {
    table.allows(backend, addresses.get(&backend).copied(), protocol, port)
}

/// Adds each ClusterIP of `frontends` to the `except` list of every allow
/// whose CIDR contains it, unless `table` (the allows as written) lets
/// through every backend of each of its ports (kube-proxy would send the
/// packet to one of them; `cluster_ip_allows` then says which ports).
pub fn withhold_cluster_ips(
    table: Backends<'_>,
    frontends: &[Frontend<'_>],
    allows: &mut [Allow<'_>],
) {
    for frontend in frontends {
        for ip in &frontend.cluster_ips {
            let through_every_port = !frontend.ports.is_empty()
                && frontend.ports.iter().all(|port| {
                    let mut backends = port.backends_for(*ip).peekable();
                    backends.peek().is_some()
                        && backends.all(|(backend, target)| {
                            allows_backend(table, *backend, port.protocol.number(), *target)
                        })
                });
            if through_every_port {
                continue;
            }
            let Ok(host) = IpNetwork::new(*ip, if ip.is_ipv4() { 32 } else { 128 }) else {
                continue;
            };
            for allow in allows.iter_mut().filter(|a| a.cidr.contains(*ip)) {
                if !allow.except.iter().any(|e| e.contains(*ip)) {
                    allow.except.push(host);
                }
            }
        }
    }
}

/// The ClusterIP entries an egress `table` earns: for each Service port
/// and ClusterIP, that port when the table allows every backend of the
/// ClusterIP's family (kube-proxy translates within a family) on its target
/// port, and there is at least one.
pub fn cluster_ip_allows<'a>(table: Backends<'_>, frontends: &[Frontend<'a>]) -> Vec<Allow<'a>> {
    let mut out = Vec::new();
    for frontend in frontends {
        for port in &frontend.ports {
            for ip in &frontend.cluster_ips {
                let mut backends = port.backends_for(*ip).peekable();
                if backends.peek().is_none()
                    || !backends.all(|(backend, target)| {
                        allows_backend(table, *backend, port.protocol.number(), *target)
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
