//! Names and MACs of an attachment, derived from (network, container ID,
//! ifname): stable, so DEL and CHECK find it again without stored state.

use sha2::Digest;
use sha2::Sha256;

pub type Mac = [u8; 6];

/// Names and MACs derived from (network, container ID, ifname): stable, so
/// DEL and CHECK find the attachment again without any stored state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachmentNames {
    /// Host-side veth: "fl" + 12 hex digits, 14 bytes (Linux allows 15).
    pub host_veth: String,
    pub host_mac: Mac,
    pub pod_mac: Mac,
}

impl AttachmentNames {
    pub fn new(network: &str, container_id: &str, ifname: &str) -> Self {
        let digest = Sha256::new()
            .chain_update(network)
            .chain_update([0])
            .chain_update(container_id)
            .chain_update([0])
            .chain_update(ifname)
            .finalize();
        let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
        // Locally administered unicast MACs (0x02 first byte), distinct per side.
        let mut host_mac = [0x02, 0, 0, 0, 0, 0];
        host_mac[1..].copy_from_slice(&digest[6..11]);
        let mut pod_mac = [0x02, 0, 0, 0, 0, 0];
        pod_mac[1..].copy_from_slice(&digest[11..16]);
        if pod_mac == host_mac {
            pod_mac[5] ^= 1;
        }
        AttachmentNames {
            host_veth: format!("fl{hex}"),
            host_mac,
            pod_mac,
        }
    }
}

pub fn format_mac(mac: &Mac) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

pub fn parse_mac(text: &str) -> Option<Mac> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_short_and_distinct() {
        let a = AttachmentNames::new("pods", "c1", "eth0");
        assert_eq!(a, AttachmentNames::new("pods", "c1", "eth0"));
        assert_eq!(a.host_veth.len(), 14);
        assert!(a.host_veth.starts_with("fl"));
        for other in [
            AttachmentNames::new("pods", "c1", "eth1"),
            AttachmentNames::new("pods", "c2", "eth0"),
            AttachmentNames::new("pods2", "c1", "eth0"),
            // The separator keeps ("ab","c") and ("a","bc") apart.
            AttachmentNames::new("pod", "sc1", "eth0"),
        ] {
            assert_ne!(a.host_veth, other.host_veth);
        }
        assert_ne!(a.host_mac, a.pod_mac);
        assert_eq!(a.host_mac[0] & 0x03, 0x02, "locally administered unicast");
        assert_eq!(a.pod_mac[0] & 0x03, 0x02);
    }

    #[test]
    fn macs_round_trip() {
        let mac = [0x02, 0xab, 0, 1, 0xff, 9];
        assert_eq!(format_mac(&mac), "02:ab:00:01:ff:09");
        assert_eq!(parse_mac("02:ab:00:01:ff:09"), Some(mac));
        assert_eq!(parse_mac("02:ab:00:01:ff"), None);
        assert_eq!(parse_mac("02:ab:00:01:ff:09:00"), None);
        assert_eq!(parse_mac("zz:ab:00:01:ff:09"), None);
    }
}
