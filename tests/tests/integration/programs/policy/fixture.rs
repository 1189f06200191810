//! What the NetworkPolicy cases write and read: port ranges and rules,
//! a pod's policy tables set on the node and its drops read back, and an
//! ICMP echo request of either family.

use std::net::IpAddr;

use flatnet_datapath::bpf::{PolicyPortRange, PolicyPorts, PolicyRule, PolicyTable};
use flatnet_tests::frames::*;
use flatnet_tests::test_run::{TC_ACT_REDIRECT, TC_ACT_SHOT};

use crate::programs::{FAMILIES, Hook, Node, Pod, TTL};

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

    /// Writes `pod`'s tables, by prefix and by peer identity.
    pub(in crate::programs) fn set_tables(
        &self,
        pod: &Pod,
        ingress: Option<PolicyTable<'_>>,
        egress: Option<PolicyTable<'_>>,
    ) {
        let datapath = &self.scratch.datapath;
        self.netns
            .run(|| datapath.set_pod_tables(pod.slot, ingress, egress))
            .expect("writing a pod's policy");
    }

    /// Gives `pod`'s addresses identity `identity`.
    pub(in crate::programs) fn name_pod(&self, pod: &Pod, identity: u32) {
        let entries: Vec<_> = FAMILIES.iter().map(|f| (pod.ip(*f), identity)).collect();
        self.scratch
            .datapath
            .write_peer_ids(&entries)
            .expect("writing peer identities");
    }

    /// Runs `frame`, sent by `from` to local pod `to`, through `from`'s tc
    /// program: redirected into `to` when `allowed`, else dropped by policy
    /// (rewritten for `to` all the same: judged once the datapath decided).
    pub(super) fn pod_to_pod(
        &self,
        case: &str,
        (from, to): (&Pod, &Pod),
        frame: &[u8],
        allowed: bool,
    ) {
        let (verdict, counter) = if allowed {
            (TC_ACT_REDIRECT, "redirected")
        } else {
            (TC_ACT_SHOT, "policy_denied")
        };
        self.check(
            case,
            Hook::PodTc(from),
            frame,
            verdict,
            &to.receives(frame),
            &[(counter, 1)],
        );
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
