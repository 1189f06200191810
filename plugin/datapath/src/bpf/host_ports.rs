//! A Pod's hostPorts in BPF, without portmap's iptables rules: each is a
//! frontend of the Service maps (`FRONTEND_F_HOST_PORT`) with the pod as its
//! one backend, served where NodePorts are (the socket programs for pods
//! and the node, the uplink program for clients outside), the client's
//! address kept as portmap's DNAT keeps it.
//!
//! The CNI plugin writes them at ADD and removes them at DEL and GC; the
//! agent, which owns every other frontend, leaves them alone. Which
//! frontends an attachment holds is recorded in a file per host veth
//! (written before the maps, so a crash leaves nothing DEL and GC cannot
//! find). One lock per datapath orders the writers of hostPorts and of
//! `EXTERNAL_PORTS`, whose entries the agent and the plugin share (a half
//! each, see `external_port`).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use flatnet_common::{
    BackendKey, FRONTEND_F_EXTERNAL, FRONTEND_F_HOST_PORT, FRONTEND_F_KEEP_CLIENT,
    HOST_PORT_ID_BASE, MAP_SERVICES, ServiceKey, ServiceValue, external_port,
};
use serde::{Deserialize, Serialize};

use super::services::protocol_name;
use flatnet_common::maps;

use super::Datapath;
use super::services::{service_backend, service_key};
use crate::error::{Error, Result};
use crate::lock::{LOCK_DIR, Lock};

/// One frontend of a hostPort: `address` (unspecified: every address
/// NodePorts answer on, a hostPort without `hostIP`), `port`, IP
/// `protocol`, and the pod's address and container port behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HostPort {
    pub address: IpAddr,
    pub port: u16,
    pub protocol: u8,
    pub backend: SocketAddr,
}

impl std::fmt::Display for HostPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let on = if self.address.is_unspecified() {
            "every node address".to_string()
        } else {
            self.address.to_string()
        };
        write!(
            f,
            "hostPort {}/{} on {on}",
            self.port,
            protocol_name(self.protocol)
        )
    }
}

impl Datapath {
    /// Where the attachments' records are (tmpfs, beside the locks).
    fn host_port_records(&self) -> PathBuf {
        PathBuf::from(LOCK_DIR).join(format!("host-ports-{}", self.name_on_node()))
    }

    pub(super) fn host_port_lock(&self) -> Result<Lock> {
        Lock::exclusive(&format!("host-ports-{}", self.name_on_node()))
    }

    /// The pin directory's name: one per network and pin root.
    fn name_on_node(&self) -> String {
        self.pin_dir()
            .to_string_lossy()
            .trim_matches('/')
            .replace('/', "_")
    }

    /// Every attachment's hostPorts, by host veth.
    pub fn host_ports(&self) -> BTreeMap<String, Vec<HostPort>> {
        crate::records::read_all(&self.host_port_records())
            .into_iter()
            .collect()
    }

    /// Serves `ports` to the attachment behind `host_veth`. Refused, with
    /// nothing written, when another pod's hostPort or a Service holds one
    /// of them on this node.
    pub fn put_host_ports(&self, host_veth: &str, ports: &[HostPort]) -> Result<()> {
        let _lock = self.host_port_lock()?;
        let held = self.host_ports();
        for port in ports {
            let holder = held
                .iter()
                .filter(|(veth, _)| veth.as_str() != host_veth)
                .find(|(_, theirs)| theirs.iter().any(|other| same_frontend(other, port)));
            if let Some((veth, _)) = holder {
                return Err(Error::Config(format!(
                    "{port} is held by the pod behind {veth}: give this pod another hostPort (or hostIP)"
                )));
            }
        }
        // A repeated ADD of the attachment may hold fewer: those go first.
        let before = held.get(host_veth).cloned().unwrap_or_default();
        for gone in before.iter().filter(|port| !ports.contains(port)) {
            self.forget_host_port(gone)?;
        }
        self.write_record(host_veth, ports)?;
        let mut numbers: Vec<u16> = ports.iter().chain(&before).map(|p| p.port).collect();
        numbers.push(external_port::ANY_PORT);
        numbers.sort_unstable();
        numbers.dedup();
        for number in numbers {
            let bits = host_port_bits(&held, Some((host_veth, ports)), number);
            self.set_host_port_bits(number, bits)?;
        }
        ports.iter().try_for_each(|port| self.put_host_port(port))
    }

    /// Deletes `port`'s frontend if it is still this hostPort's.
    fn forget_host_port(&self, port: &HostPort) -> Result<()> {
        let key = service_key(port.address, port.port, port.protocol);
        let ours = self
            .hash_map::<maps::SERVICES>()?
            .get(&key, 0)
            .is_ok_and(|value| value.flags & FRONTEND_F_HOST_PORT != 0);
        if ours
            && self.service_backends(&key)?.as_deref() == Some(&[service_backend(port.backend)][..])
        {
            self.delete_service(&key)?;
        }
        Ok(())
    }

    fn put_host_port(&self, port: &HostPort) -> Result<()> {
        let key = service_key(port.address, port.port, port.protocol);
        let frontends = self.hash_map::<maps::SERVICES>()?;
        let previous = frontends.get(&key, 0).ok();
        let backend = service_backend(port.backend);
        if let Some(previous) = previous
            && previous.flags & FRONTEND_F_HOST_PORT != 0
            && self.service_backends(&key)?.as_deref() == Some(&[backend][..])
        {
            return Ok(());
        }
        let value = ServiceValue {
            id: self.free_host_port_id(&key, previous.map(|p| p.id))?,
            count: 1,
            affinity_secs: 0,
            external_count: 1,
            flags: FRONTEND_F_EXTERNAL | FRONTEND_F_KEEP_CLIENT | FRONTEND_F_HOST_PORT,
        };
        self.put_frontend(&key, &[backend], value)
            .map_err(|e| match e {
                Error::Config(_) => Error::Config(format!(
                    "{port} is a Service's frontend on this node (a NodePort, externalIP or load-balancer IP): give this pod another hostPort"
                )),
                other => other,
            })
    }

    /// A backend-set id in the hostPorts' range that no set uses (the
    /// lock is held: no other plugin takes one meanwhile), and not `not`.
    fn free_host_port_id(&self, key: &ServiceKey, not: Option<u32>) -> Result<u32> {
        let sets = self.hash_map::<maps::SERVICE_BACKENDS>()?;
        let seed = key
            .address
            .iter()
            .chain(&key.port)
            .chain(&[key.protocol, key.family])
            .fold(0x811c_9dc5_u32, |hash, byte| {
                (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
            });
        (0..1024u32)
            .map(|probe| HOST_PORT_ID_BASE | (seed.wrapping_add(probe) & !HOST_PORT_ID_BASE))
            .find(|id| Some(*id) != not && sets.get(&BackendKey { id: *id, index: 0 }, 0).is_err())
            .ok_or_else(|| Error::Datapath("no free backend-set id for a hostPort".into()))
    }

    /// Takes away the hostPorts of the attachment behind `host_veth` (none:
    /// nothing to do).
    pub fn remove_host_ports(&self, host_veth: &str) -> Result<()> {
        let path = self.host_port_records().join(host_veth);
        if !path.exists() {
            return Ok(());
        }
        let _lock = self.host_port_lock()?;
        let held = self.host_ports();
        let Some(ports) = held.get(host_veth) else {
            return crate::util::remove_file_if_present(&path)
                .map(drop)
                .map_err(|e| Error::io(format!("removing {}", path.display()), e));
        };
        if self.map_path(MAP_SERVICES).exists() {
            for port in ports {
                self.forget_host_port(port)?;
                let bits = host_port_bits(&held, Some((host_veth, &[])), port.port);
                self.set_host_port_bits(port.port, bits)?;
            }
            let any = external_port::ANY_PORT;
            self.set_host_port_bits(any, host_port_bits(&held, Some((host_veth, &[])), any))?;
        }
        crate::util::remove_file_if_present(&path)
            .map(drop)
            .map_err(|e| Error::io(format!("removing {}", path.display()), e))
    }

    /// Takes away the hostPorts of every attachment `keep` refuses (GC).
    pub fn retain_host_ports(&self, keep: impl Fn(&str) -> bool) -> Result<()> {
        for veth in self.host_ports().into_keys().filter(|veth| !keep(veth)) {
            self.remove_host_ports(&veth)?;
        }
        Ok(())
    }

    fn write_record(&self, host_veth: &str, ports: &[HostPort]) -> Result<()> {
        crate::records::write(&self.host_port_records(), host_veth, &ports)
    }

    /// Sets the hostPort half of `port`'s `EXTERNAL_PORTS` entry (the lock
    /// held).
    fn set_host_port_bits(&self, port: u16, bits: u32) -> Result<()> {
        self.set_port_half(
            port,
            bits << external_port::HOST_PORT_SHIFT,
            !external_port::SERVICE_BITS,
        )
    }

    /// Removes the records folder and the lock (the network is torn down,
    /// its maps with it).
    pub(super) fn remove_host_port_records(&self) -> Result<()> {
        let records = self.host_port_records();
        let lock_file =
            PathBuf::from(LOCK_DIR).join(format!("host-ports-{}.lock", self.name_on_node()));
        // A network that never had a hostPort: nothing to lock or remove.
        if !records.exists() && !lock_file.exists() {
            return Ok(());
        }
        let lock = self.host_port_lock()?;
        let _ = std::fs::remove_dir_all(&records);
        lock.remove()
    }
}

/// Two hostPorts that would answer the same packets: same port and
/// protocol, and the same address or either on every address of its
/// family.
fn same_frontend(a: &HostPort, b: &HostPort) -> bool {
    a.port == b.port
        && a.protocol == b.protocol
        && a.address.is_ipv4() == b.address.is_ipv4()
        && (a.address == b.address || a.address.is_unspecified() || b.address.is_unspecified())
}

/// The `external_port` bits (unshifted) of `port` (`ANY_PORT`: of every
/// port) from the hostPorts of `held`, with `host_veth`'s replaced by
/// `theirs`.
fn host_port_bits(
    held: &BTreeMap<String, Vec<HostPort>>,
    replaced: Option<(&str, &[HostPort])>,
    port: u16,
) -> u32 {
    let others = held
        .iter()
        .filter(|(veth, _)| replaced.is_none_or(|(replaced, _)| veth.as_str() != replaced))
        .flat_map(|(_, ports)| ports.iter());
    let own = replaced.into_iter().flat_map(|(_, ports)| ports.iter());
    others
        .chain(own)
        .filter(|host_port| port == external_port::ANY_PORT || host_port.port == port)
        .map(|host_port| {
            if host_port.address.is_unspecified() {
                external_port::nodeport_bit(host_port.protocol)
            } else {
                external_port::address_bit(host_port.protocol)
            }
        })
        .fold(0, |bits, bit| bits | bit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_port(address: &str, port: u16, protocol: u8) -> HostPort {
        HostPort {
            address: address.parse().unwrap(),
            port,
            protocol,
            backend: "10.1.0.5:80".parse().unwrap(),
        }
    }

    #[test]
    fn host_ports_on_one_address_or_every_one_meet_by_port_protocol_and_family() {
        let wildcard = host_port("0.0.0.0", 8080, 6);
        assert!(same_frontend(&wildcard, &host_port("10.0.0.1", 8080, 6)));
        assert!(same_frontend(&host_port("10.0.0.1", 8080, 6), &wildcard));
        assert!(!same_frontend(&wildcard, &host_port("0.0.0.0", 8080, 17)));
        assert!(!same_frontend(&wildcard, &host_port("0.0.0.0", 8081, 6)));
        assert!(!same_frontend(&wildcard, &host_port("::", 8080, 6)));
        assert!(!same_frontend(
            &host_port("127.0.0.1", 8080, 6),
            &host_port("10.0.0.1", 8080, 6)
        ));
    }

    #[test]
    fn a_ports_bits_come_from_every_attachments_host_ports() {
        let held = BTreeMap::from([
            ("a".to_string(), vec![host_port("0.0.0.0", 8080, 6)]),
            ("b".to_string(), vec![host_port("10.0.0.1", 8080, 17)]),
        ]);
        assert_eq!(
            host_port_bits(&held, None, 8080),
            external_port::NODEPORT_TCP | external_port::ADDRESS_UDP
        );
        assert_eq!(host_port_bits(&held, None, 8081), 0);
        let mut elsewhere = held.clone();
        elsewhere.insert("c".into(), vec![host_port("0.0.0.0", 9000, 17)]);
        assert_eq!(
            host_port_bits(&elsewhere, None, external_port::ANY_PORT),
            external_port::NODEPORT_TCP | external_port::ADDRESS_UDP | external_port::NODEPORT_UDP
        );
        assert_eq!(
            host_port_bits(&held, Some(("a", &[])), external_port::ANY_PORT),
            external_port::ADDRESS_UDP
        );
        // "b" leaving, or replaced by another port.
        assert_eq!(
            host_port_bits(&held, Some(("b", &[])), 8080),
            external_port::NODEPORT_TCP
        );
        let moved = [host_port("::", 8080, 17)];
        assert_eq!(
            host_port_bits(&held, Some(("b", &moved)), 8080),
            external_port::NODEPORT_TCP | external_port::NODEPORT_UDP
        );
    }

    #[test]
    fn a_host_port_names_itself_as_an_operator_writes_it() {
        assert_eq!(
            host_port("0.0.0.0", 8080, 6).to_string(),
            "hostPort 8080/TCP on every node address"
        );
        assert_eq!(
            host_port("127.0.0.1", 53, 17).to_string(),
            "hostPort 53/UDP on 127.0.0.1"
        );
    }
}
