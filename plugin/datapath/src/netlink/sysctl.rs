//! Writing a sysctl, and the node's forwarding switches.

use std::net::IpAddr;

use crate::error::{Error, Result};

/// Writes a sysctl under /proc/sys (of the current thread's namespace).
pub fn set_sysctl(key: &str, value: &str) -> Result<()> {
    let path = format!("/proc/sys/{key}");
    std::fs::write(&path, value).map_err(|e| Error::io(format!("writing {value} to {path}"), e))
}

/// Reads a sysctl under /proc/sys (of the current thread's namespace),
/// trimmed; `None` when the key does not exist (IPv6 disabled at boot).
pub fn read_sysctl(key: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/sys/{key}"))
        .ok()
        .map(|value| value.trim().to_string())
}

/// The families whose forwarding a network needs: each family it gives
/// pods addresses in. Everything the datapath leaves to the host stack
/// (a shaped pod, a Service's DNAT, another node on the stack path, the
/// outside) is forwarded by the host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Forwarding {
    pub ipv4: bool,
    pub ipv6: bool,
}

/// The sysctl that switches a family's forwarding on for the whole node
/// (namespace); the reference bridge plugin turns on the same two.
pub const IPV4_FORWARD: &str = "net/ipv4/ip_forward";
pub const IPV6_FORWARD: &str = "net/ipv6/conf/all/forwarding";

impl Forwarding {
    /// The families of `addresses`.
    pub fn for_addresses<'a>(addresses: impl IntoIterator<Item = &'a IpAddr>) -> Self {
        addresses
            .into_iter()
            .fold(Forwarding::default(), |wanted, ip| Forwarding {
                ipv4: wanted.ipv4 || ip.is_ipv4(),
                ipv6: wanted.ipv6 || ip.is_ipv6(),
            })
    }

    /// The sysctls this needs, each with its family's name.
    fn keys(self) -> impl Iterator<Item = (&'static str, &'static str)> {
        [
            (self.ipv4, IPV4_FORWARD, "IPv4"),
            (self.ipv6, IPV6_FORWARD, "IPv6"),
        ]
        .into_iter()
        .filter(|(wanted, _, _)| *wanted)
        .map(|(_, key, family)| (key, family))
    }

    /// Turns forwarding on where it is off (read first: a write of IPv6's
    /// switch walks every interface, and most ADDs find it on already).
    pub fn ensure(self) -> Result<()> {
        for (key, _) in self.keys() {
            if read_sysctl(key).as_deref() != Some("1") {
                set_sysctl(key, "1")?;
            }
        }
        Ok(())
    }

    /// What is off of what this needs, said so an operator can act on it.
    pub fn problems(self) -> Vec<String> {
        self.keys()
            .filter_map(|(key, family)| {
                let value = read_sysctl(key);
                (value.as_deref() != Some("1")).then(|| {
                    format!(
                        "{family} forwarding is off ({} = {}): pods' traffic that the host stack forwards (to a shaped pod, through a Service's DNAT, to another node or outside) is dropped; flatnet's next ADD turns it on again, or `sysctl -w {}=1`",
                        key.replace('/', "."),
                        value.as_deref().unwrap_or("missing"),
                        key.replace('/', ".")
                    )
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarding_follows_the_families_of_the_addresses() {
        let v4: IpAddr = "10.1.0.2".parse().unwrap();
        let v6: IpAddr = "fd00::2".parse().unwrap();
        assert_eq!(Forwarding::for_addresses([]), Forwarding::default());
        assert_eq!(
            Forwarding::for_addresses([&v4]),
            Forwarding {
                ipv4: true,
                ipv6: false
            }
        );
        assert_eq!(
            Forwarding::for_addresses([&v6]),
            Forwarding {
                ipv4: false,
                ipv6: true
            }
        );
        assert_eq!(
            Forwarding::for_addresses([&v4, &v6]),
            Forwarding {
                ipv4: true,
                ipv6: true
            }
        );
        let keys: Vec<_> = Forwarding::for_addresses([&v6]).keys().collect();
        assert_eq!(keys, vec![(IPV6_FORWARD, "IPv6")]);
    }
}
