//! Names and addresses as kube-proxy writes them in its rules, in both
//! modes: the chain-name hash, a host's CIDR, a DNAT target.

use std::net::{IpAddr, SocketAddr};

use sha2::Digest;

/// kube-proxy's chain-name hash: base32 of the SHA-256 of the name,
/// truncated (16 characters in iptables mode, 8 in nftables mode).
pub(crate) fn hash(input: &str, len: usize) -> String {
    let digest = sha2::Sha256::digest(input.as_bytes());
    data_encoding::BASE32.encode(&digest)[..len].to_string()
}

/// `addr/32` or `addr/128`.
pub(crate) fn host_cidr(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(_) => format!("{ip}/32"),
        IpAddr::V6(_) => format!("{ip}/128"),
    }
}

/// "ip:port" or "[ip]:port", as DNAT targets are written.
pub(crate) fn target(endpoint: SocketAddr) -> String {
    endpoint.to_string()
}
