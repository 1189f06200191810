//! The transport protocols Kubernetes names (NetworkPolicy ports and
//! Service ports alike), as IP protocol numbers.

/// The transport protocols NetworkPolicy knows, as IP protocol numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Protocol {
    Tcp = 6,
    Udp = 17,
    Sctp = 132,
}

impl Protocol {
    /// The IP protocol number (the `protocol` field of an IP header).
    pub fn number(self) -> u8 {
        self as u8
    }

    /// A Kubernetes protocol name; unset means TCP, as upstream defaults it.
    /// Anything else is none of ours (the API server rejects it).
    pub fn from_kube(name: Option<&str>) -> Option<Protocol> {
        match name.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: Protocol = Protocol::Tcp;
    const UDP: Protocol = Protocol::Udp;

    #[test]
    fn protocols_default_to_tcp_and_unknown_ones_are_refused() {
        assert_eq!(Protocol::from_kube(None), Some(TCP));
        assert_eq!(Protocol::from_kube(Some("UDP")), Some(UDP));
        assert_eq!(
            Protocol::from_kube(Some("SCTP")).map(Protocol::number),
            Some(132)
        );
        assert_eq!(Protocol::from_kube(Some("tcp")), None);
    }
}
