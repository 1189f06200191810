//! What the NetworkPolicy cases write and read: port ranges and rules,
//! a pod's policy tables set on the node and its drops read back, and an
//! ICMP echo request of either family.

use std::net::IpAddr;

use flatnet_datapath::bpf::{PolicyPortRange, PolicyPorts, PolicyRule};
use flatnet_tests::frames::*;

use crate::programs::{Node, Pod, TTL};

/// TCP to `port` only.
pub(in crate::programs) fn tcp_port(port: u16) -> PolicyPortRange {
    PolicyPortRange {
        protocol: IPPROTO_TCP,
        first: port,
        last: port,
    }
}

pub(super) fn udp_port(port: u16) -> PolicyPortRange {
    PolicyPortRange {
        protocol: IPPROTO_UDP,
        first: port,
        last: port,
    }
}

/// A rule for `cidr` allowing `ranges` (none: an explicit deny).
pub(in crate::programs) fn rule(cidr: &str, ranges: &[PolicyPortRange]) -> PolicyRule {
    PolicyRule {
        cidr: cidr.parse().expect("CIDR"),
        ports: PolicyPorts::Ranges(ranges.to_vec()),
    }
}

pub(super) fn any_from(cidr: &str) -> PolicyRule {
    PolicyRule {
        cidr: cidr.parse().expect("CIDR"),
        ports: PolicyPorts::Any,
    }
}

impl Node {
    /// Isolates `pod` with these tables (in the node's namespace: the
    /// library attaches `to_pod` to the pod's host veth there).
    pub(in crate::programs) fn set_policy(
        &self,
        pod: &Pod,
        ingress: Option<&[PolicyRule]>,
        egress: Option<&[PolicyRule]>,
    ) {
        let datapath = &self.scratch.datapath;
        self.netns
            .run(|| datapath.set_pod_policy(pod.slot, ingress, egress))
            .expect("writing a pod's policy");
    }

    /// What policy dropped of `pod`: (ingress, egress) packets.
    pub(in crate::programs) fn policy_drops(&self, pod: &Pod) -> (u64, u64) {
        self.scratch
            .datapath
            .policy_drops(pod.slot)
            .expect("reading policy drops")
    }
}

/// An ICMP echo request of the addresses' family, as an IP packet.
pub(super) fn ip_echo(src: IpAddr, dst: IpAddr) -> (u16, Vec<u8>) {
    let (proto, message) = echo_request(src, dst);
    ip(src, dst, TTL, proto, &message)
}
