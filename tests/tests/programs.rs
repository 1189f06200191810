//! The datapath's programs, one frame at a time: each case crafts a frame
//! by hand, runs `from_pod`, `from_uplink` or `from_pod_xdp` on it with
//! `BPF_PROG_TEST_RUN` (`flatnet_tests::test_run`) and checks the verdict,
//! every byte of the frame the program left and the `STATS` counters it
//! moved. No pod, no traffic: the "pods" are map entries whose host veths
//! are veth links in the test's own network namespace (test_run needs real
//! ifindexes there), and the conntrack entries the Services cases judge are
//! written with `conntrack -I` into that namespace's table. Everything goes
//! with the namespace and the test's pin root.
//!
//! What test_run cannot show: a redirect is only its return value (the
//! frame goes nowhere); the kernel refuses (EINVAL) a frame shorter than an
//! Ethernet header in tc and XDP alike, and, in tc, an IPv4 or IPv6
//! ethertype without a whole IP header, so those cut-short headers run in
//! XDP mode, which makes the same decision; tc's `skb->tc_classid` is
//! always 0, so `from_pod` runs without the sender's counter slot and
//! checks sources in `ENDPOINTS_V4/V6`, while the `POD_SOURCES` check runs
//! in the XDP cases, where the program finds the slot itself.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use flatnet::config::DatapathMode;
use flatnet_common::{
    Counter, Endpoint, POLICY_DIR_EGRESS, POLICY_DIR_INGRESS, POLICY_EVENTS_BYTES, POLICY_F_EGRESS,
    POLICY_F_INGRESS, POLICY_REASON_EXCEPT, POLICY_REASON_NO_PREFIX, POLICY_REASON_PORT,
    PROG_FROM_POD, PROG_FROM_POD_XDP, PROG_FROM_UPLINK, PROG_TO_POD, PolicyEvent, SOURCES_F_MORE,
    action,
};
use flatnet_datapath::bpf::Shaping;
use flatnet_datapath::bpf::{PolicyPortRange, PolicyPorts, PolicyRule};
use flatnet_tests::test_run::{
    Outcome, ScratchDatapath, TC_ACT_REDIRECT, TC_ACT_SHOT, TC_NEXT, XDP_DROP, XDP_PASS,
    XDP_REDIRECT, XDP_TX, run_tc, run_xdp,
};
use flatnet_tests::{Netns, root_or_skip};
use frame::*;
use ipnetwork::IpNetwork;

/// Frames built byte by byte, checksums computed here (RFC 1071), not
/// with anything of the datapath's.
mod frame {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    pub type Mac = [u8; 6];

    pub const ETH_P_IP: u16 = 0x0800;
    pub const ETH_P_ARP: u16 = 0x0806;
    pub const ETH_P_IPV6: u16 = 0x86dd;
    pub const ETH_P_8021Q: u16 = 0x8100;
    pub const IPPROTO_ICMP: u8 = 1;
    pub const IPPROTO_TCP: u8 = 6;
    pub const IPPROTO_UDP: u8 = 17;
    pub const IPPROTO_ICMPV6: u8 = 58;
    pub const ETH_LEN: usize = 14;
    pub const IPV4_LEN: usize = 20;
    pub const IPV6_LEN: usize = 40;
    pub const BROADCAST: Mac = [0xff; 6];
    pub const TCP_SYN: u8 = 0x02;
    pub const TCP_ACK: u8 = 0x10;
    pub const ARPOP_REQUEST: u16 = 1;
    pub const ARPOP_REPLY: u16 = 2;
    pub const ND_NEIGHBOR_SOLICIT: u8 = 135;
    pub const ND_NEIGHBOR_ADVERT: u8 = 136;
    /// Hop limit every neighbour discovery message carries (RFC 4861).
    pub const ND_HOP_LIMIT: u8 = 255;

    /// The Internet checksum: ones' complement of the ones' complement sum
    /// of the 16-bit words (an odd last byte padded with zero). Over data
    /// that holds a correct checksum it gives 0.
    pub fn checksum(bytes: &[u8]) -> u16 {
        let mut sum: u32 = bytes
            .chunks(2)
            .map(|pair| u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    /// The pseudo-header TCP, UDP and ICMPv6 checksums cover.
    pub fn pseudo_header(src: IpAddr, dst: IpAddr, proto: u8, len: usize) -> Vec<u8> {
        match (src, dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => [
                &src.octets()[..],
                &dst.octets(),
                &[0, proto],
                &(len as u16).to_be_bytes(),
            ]
            .concat(),
            (IpAddr::V6(src), IpAddr::V6(dst)) => [
                &src.octets()[..],
                &dst.octets(),
                &(len as u32).to_be_bytes(),
                &[0, 0, 0, proto],
            ]
            .concat(),
            _ => panic!("{src} and {dst} are of different families"),
        }
    }

    /// `message` with the checksum at `at` computed over the pseudo-header
    /// of (`src`, `dst`, `proto`) and the message.
    fn with_checksum(
        mut message: Vec<u8>,
        at: usize,
        src: IpAddr,
        dst: IpAddr,
        proto: u8,
    ) -> Vec<u8> {
        let covered = [
            pseudo_header(src, dst, proto, message.len()),
            message.clone(),
        ]
        .concat();
        message[at..at + 2].copy_from_slice(&checksum(&covered).to_be_bytes());
        message
    }

    pub fn ethernet(dst: Mac, src: Mac, ethertype: u16, payload: &[u8]) -> Vec<u8> {
        [&dst[..], &src, &ethertype.to_be_bytes(), payload].concat()
    }

    /// An Ethernet/IPv4 ARP message.
    pub fn arp(
        operation: u16,
        sender_mac: Mac,
        sender_ip: Ipv4Addr,
        target_mac: Mac,
        target_ip: Ipv4Addr,
    ) -> Vec<u8> {
        [
            &1u16.to_be_bytes()[..],
            &ETH_P_IP.to_be_bytes(),
            &[6, 4],
            &operation.to_be_bytes(),
            &sender_mac,
            &sender_ip.octets(),
            &target_mac,
            &target_ip.octets(),
        ]
        .concat()
    }

    /// An IPv4 header without options (DF set) and `payload`.
    pub fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, ttl: u8, proto: u8, payload: &[u8]) -> Vec<u8> {
        ipv4_with_id(src, dst, ttl, proto, 0x1234, payload)
    }

    /// `ipv4` with the identification `id` (which moves the checksum).
    pub fn ipv4_with_id(
        src: Ipv4Addr,
        dst: Ipv4Addr,
        ttl: u8,
        proto: u8,
        id: u16,
        payload: &[u8],
    ) -> Vec<u8> {
        let total = (IPV4_LEN + payload.len()) as u16;
        let mut header = [
            &[0x45, 0][..],
            &total.to_be_bytes(),
            &id.to_be_bytes(),
            &0x4000u16.to_be_bytes(),
            &[ttl, proto, 0, 0],
            &src.octets(),
            &dst.octets(),
        ]
        .concat();
        let sum = checksum(&header);
        header[10..12].copy_from_slice(&sum.to_be_bytes());
        [header, payload.to_vec()].concat()
    }

    /// An IPv6 header (no extension headers) and `payload`.
    pub fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, hop_limit: u8, next: u8, payload: &[u8]) -> Vec<u8> {
        [
            &[0x60, 0, 0, 0][..],
            &(payload.len() as u16).to_be_bytes(),
            &[next, hop_limit],
            &src.octets(),
            &dst.octets(),
            payload,
        ]
        .concat()
    }

    /// An IP packet of the addresses' family: (ethertype, packet).
    pub fn ip(src: IpAddr, dst: IpAddr, ttl: u8, proto: u8, payload: &[u8]) -> (u16, Vec<u8>) {
        match (src, dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => (ETH_P_IP, ipv4(src, dst, ttl, proto, payload)),
            (IpAddr::V6(src), IpAddr::V6(dst)) => (ETH_P_IPV6, ipv6(src, dst, ttl, proto, payload)),
            _ => panic!("{src} and {dst} are of different families"),
        }
    }

    /// A TCP header without options, no payload.
    pub fn tcp(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, flags: u8) -> Vec<u8> {
        let ack_number: u32 = if flags & TCP_ACK != 0 { 1 } else { 0 };
        let segment = [
            &sport.to_be_bytes()[..],
            &dport.to_be_bytes(),
            &0x1000_0000u32.to_be_bytes(),
            &ack_number.to_be_bytes(),
            &[0x50, flags],
            &64240u16.to_be_bytes(),
            &[0, 0, 0, 0],
        ]
        .concat();
        with_checksum(segment, 16, src, dst, IPPROTO_TCP)
    }

    pub fn udp(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        let datagram = [
            &sport.to_be_bytes()[..],
            &dport.to_be_bytes(),
            &((8 + payload.len()) as u16).to_be_bytes(),
            &[0, 0],
            payload,
        ]
        .concat();
        with_checksum(datagram, 6, src, dst, IPPROTO_UDP)
    }

    /// An ICMP message (its checksum covers the message alone).
    pub fn icmpv4(icmp_type: u8, code: u8, body: &[u8]) -> Vec<u8> {
        let mut message = [&[icmp_type, code, 0, 0][..], body].concat();
        let sum = checksum(&message);
        message[2..4].copy_from_slice(&sum.to_be_bytes());
        message
    }

    /// An ICMPv6 message (its checksum covers the pseudo-header too).
    pub fn icmpv6(src: Ipv6Addr, dst: Ipv6Addr, icmp_type: u8, code: u8, body: &[u8]) -> Vec<u8> {
        let message = [&[icmp_type, code, 0, 0][..], body].concat();
        with_checksum(message, 2, src.into(), dst.into(), IPPROTO_ICMPV6)
    }

    /// An echo request of the addresses' family, 8 bytes of ICMP: (protocol, message).
    pub fn echo_request(src: IpAddr, dst: IpAddr) -> (u8, Vec<u8>) {
        let id_and_sequence = [0x12, 0x34, 0, 1];
        match (src, dst) {
            (IpAddr::V6(src), IpAddr::V6(dst)) => {
                (IPPROTO_ICMPV6, icmpv6(src, dst, 128, 0, &id_and_sequence))
            }
            _ => (IPPROTO_ICMP, icmpv4(8, 0, &id_and_sequence)),
        }
    }

    /// The "port unreachable" a host at `src` sends to `dst` about
    /// `quoted` (the IP packet it got): (protocol, message).
    pub fn port_unreachable(src: IpAddr, dst: IpAddr, quoted: &[u8]) -> (u8, Vec<u8>) {
        let body = [&[0, 0, 0, 0][..], quoted].concat();
        match (src, dst) {
            (IpAddr::V6(src), IpAddr::V6(dst)) => (IPPROTO_ICMPV6, icmpv6(src, dst, 1, 4, &body)),
            _ => (IPPROTO_ICMP, icmpv4(3, 3, &body)),
        }
    }

    /// ff02::1:ffXX:XXXX, where a solicitation for `target` goes.
    pub fn solicited_node(target: Ipv6Addr) -> Ipv6Addr {
        let t = target.octets();
        Ipv6Addr::from([
            0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, t[13], t[14], t[15],
        ])
    }

    /// 33:33 and the group's last 32 bits: an IPv6 multicast's MAC.
    pub fn multicast_mac(group: Ipv6Addr) -> Mac {
        let g = group.octets();
        [0x33, 0x33, g[12], g[13], g[14], g[15]]
    }

    /// A neighbour solicitation (an IPv6 packet) for `target`, with the
    /// source link-layer option when `source_mac` is given.
    pub fn neighbour_solicitation(
        src: Ipv6Addr,
        target: Ipv6Addr,
        source_mac: Option<Mac>,
    ) -> Vec<u8> {
        let dst = solicited_node(target);
        let option: Vec<u8> = source_mac
            .map(|mac| [&[1, 1][..], &mac].concat())
            .unwrap_or_default();
        let body = [&[0, 0, 0, 0][..], &target.octets(), &option].concat();
        ipv6(
            src,
            dst,
            ND_HOP_LIMIT,
            IPPROTO_ICMPV6,
            &icmpv6(src, dst, ND_NEIGHBOR_SOLICIT, 0, &body),
        )
    }

    /// The advertisement a solicitation from `asker` for `target` must get:
    /// Solicited and Override set, `target_mac` in the target link-layer option.
    pub fn neighbour_advertisement(asker: Ipv6Addr, target: Ipv6Addr, target_mac: Mac) -> Vec<u8> {
        let body = [&[0x60, 0, 0, 0][..], &target.octets(), &[2, 1], &target_mac].concat();
        ipv6(
            target,
            asker,
            ND_HOP_LIMIT,
            IPPROTO_ICMPV6,
            &icmpv6(target, asker, ND_NEIGHBOR_ADVERT, 0, &body),
        )
    }

    /// `frame` with its Ethernet destination and source replaced.
    pub fn with_macs(frame: &[u8], dst: Mac, src: Mac) -> Vec<u8> {
        [&dst[..], &src, &frame[12..]].concat()
    }
}

// ---- The node the programs run for ----------------------------------------

/// Each role's address in both families.
#[derive(Clone, Copy, Debug)]
struct DualStack {
    v4: Ipv4Addr,
    v6: Ipv6Addr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

const FAMILIES: [Family; 2] = [Family::V4, Family::V6];

impl Family {
    /// The length of the family's IP header (without options or extensions).
    fn ip_header_len(self) -> usize {
        match self {
            Family::V4 => IPV4_LEN,
            Family::V6 => IPV6_LEN,
        }
    }
}

impl DualStack {
    const fn new(v4: [u8; 4], v6: [u16; 8]) -> Self {
        DualStack {
            v4: Ipv4Addr::new(v4[0], v4[1], v4[2], v4[3]),
            v6: Ipv6Addr::new(v6[0], v6[1], v6[2], v6[3], v6[4], v6[5], v6[6], v6[7]),
        }
    }

    fn of(self, family: Family) -> IpAddr {
        match family {
            Family::V4 => self.v4.into(),
            Family::V6 => self.v6.into(),
        }
    }
}

const POD_A: DualStack = DualStack::new([10, 244, 1, 2], [0xfd00, 0x244, 1, 0, 0, 0, 0, 2]);
const POD_B: DualStack = DualStack::new([10, 244, 1, 3], [0xfd00, 0x244, 1, 0, 0, 0, 0, 3]);
/// In the pods' subnet, but no pod's.
const UNUSED: DualStack = DualStack::new([10, 244, 1, 99], [0xfd00, 0x244, 1, 0, 0, 0, 0, 0x99]);
/// Outside the cluster: the host's to route.
const OUTSIDE: DualStack = DualStack::new([192, 0, 2, 10], [0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x10]);
/// A Service's ClusterIP, which the host translates to a backend.
const CLUSTER_IP: DualStack = DualStack::new([10, 96, 0, 10], [0xfd96, 0, 0, 0, 0, 0, 0, 0x10]);
/// A pod on another node (in `REMOTE_CIDRS`, via `REMOTE_NODE`).
const REMOTE_POD: DualStack = DualStack::new([10, 244, 2, 5], [0xfd00, 0x244, 2, 0, 0, 0, 0, 5]);
const REMOTE_NODE: DualStack = DualStack::new([192, 168, 50, 2], [0xfd00, 0x50, 0, 0, 0, 0, 0, 2]);
/// A pod on a third node, whose MAC this node's neighbour table lacks.
const UNRESOLVED_POD: DualStack =
    DualStack::new([10, 244, 3, 5], [0xfd00, 0x244, 3, 0, 0, 0, 0, 5]);
const UNRESOLVED_NODE: DualStack =
    DualStack::new([192, 168, 50, 3], [0xfd00, 0x50, 0, 0, 0, 0, 0, 3]);
/// This node's own address on the uplink.
const THIS_NODE: DualStack = DualStack::new([192, 168, 50, 1], [0xfd00, 0x50, 0, 0, 0, 0, 0, 1]);
/// Other nodes' pod CIDRs and their nodes, as the agent writes them.
const REMOTE_CIDRS: [(&str, IpAddr); 4] = [
    ("10.244.2.0/24", IpAddr::V4(REMOTE_NODE.v4)),
    ("fd00:244:2::/64", IpAddr::V6(REMOTE_NODE.v6)),
    ("10.244.3.0/24", IpAddr::V4(UNRESOLVED_NODE.v4)),
    ("fd00:244:3::/64", IpAddr::V6(UNRESOLVED_NODE.v6)),
];

const POD_A_MAC: Mac = [0x02, 0, 0, 0, 0x0a, 0x01];
const HOST_A_MAC: Mac = [0x02, 0, 0, 0, 0x0a, 0xfe];
const POD_B_MAC: Mac = [0x02, 0, 0, 0, 0x0b, 0x01];
const HOST_B_MAC: Mac = [0x02, 0, 0, 0, 0x0b, 0xfe];
const UPLINK_MAC: Mac = [0x02, 0, 0, 0, 0, 0xfe];
const REMOTE_NODE_MAC: Mac = [0x02, 0, 0, 0, 0, 0x02];

const TTL: u8 = 64;

/// A pod as the datapath knows it: an endpoint entry for its addresses,
/// whose host veth is a veth link of the test's namespace.
struct Pod {
    host_ifindex: u32,
    pod_mac: Mac,
    host_mac: Mac,
    slot: u32,
    addresses: DualStack,
}

impl Pod {
    /// Its entry in the endpoint maps.
    fn endpoint(&self) -> Endpoint {
        Endpoint {
            host_ifindex: self.host_ifindex,
            flags: 0,
            pod_mac: self.pod_mac,
            host_mac: self.host_mac,
            counter_slot: self.slot,
        }
    }

    fn ip(&self, family: Family) -> IpAddr {
        self.addresses.of(family)
    }

    /// A frame this pod sends: to its host veth, its only neighbour.
    fn sends(&self, (ethertype, packet): (u16, Vec<u8>)) -> Vec<u8> {
        ethernet(self.host_mac, self.pod_mac, ethertype, &packet)
    }

    /// `frame` as it must reach this pod from the datapath: addressed to
    /// it, from its host veth.
    fn receives(&self, frame: &[u8]) -> Vec<u8> {
        with_macs(frame, self.pod_mac, self.host_mac)
    }
}

/// Where a frame arrives, which picks the program that judges it.
#[derive(Clone, Copy)]
enum Hook<'a> {
    /// From a pod, on its host veth's tc ingress: `from_pod`.
    PodTc(&'a Pod),
    /// From a pod, on its host veth's XDP hook: `from_pod_xdp`.
    PodXdp(&'a Pod),
    /// From another node, on the uplink's tc ingress: `from_uplink`.
    Uplink,
    /// From the host stack into a pod, at its host veth's tc egress: `to_pod`.
    ToPod(&'a Pod),
}

type Stats = [Counter; action::COUNT as usize];

/// One node's datapath for one test: a namespace with two pods' host veths
/// and an uplink, the datapath loaded in `mode` under a pin root of its
/// own, both pods in its maps and the other nodes' pod CIDRs in its tries.
struct Node {
    netns: Netns,
    scratch: ScratchDatapath,
    a: Pod,
    b: Pod,
    uplink_ifindex: u32,
}

impl Node {
    fn new(mode: DatapathMode) -> Self {
        let netns = Netns::new();
        let scratch = ScratchDatapath::load(mode).expect("loading the datapath");
        let a_index = add_veth(&netns, "host-a", HOST_A_MAC, "pod-a");
        let b_index = add_veth(&netns, "host-b", HOST_B_MAC, "pod-b");
        let uplink_ifindex = add_veth(&netns, "uplink", UPLINK_MAC, "uplink-peer");
        let datapath = &scratch.datapath;
        let pod = |host_ifindex: u32, pod_mac: Mac, host_mac: Mac, addresses: DualStack| {
            let pod = Pod {
                host_ifindex,
                pod_mac,
                host_mac,
                slot: datapath
                    .claim_counter_slot(host_ifindex)
                    .expect("a counter slot"),
                addresses,
            };
            datapath
                .insert_pod(
                    pod.endpoint(),
                    &[addresses.v4.into(), addresses.v6.into()],
                    Shaping::default(),
                )
                .expect("inserting a pod");
            pod
        };
        let a = pod(a_index, POD_A_MAC, HOST_A_MAC, POD_A);
        let b = pod(b_index, POD_B_MAC, HOST_B_MAC, POD_B);
        let remote: Vec<(IpNetwork, IpAddr)> = REMOTE_CIDRS
            .iter()
            .map(|(cidr, node)| (cidr.parse().expect("CIDR"), *node))
            .collect();
        datapath
            .set_remote_cidrs(&remote)
            .expect("writing the remote CIDRs");
        Node {
            netns,
            scratch,
            a,
            b,
            uplink_ifindex,
        }
    }

    /// Writes `pod` into the maps again, with `shaping`.
    fn shape(&self, pod: &Pod, shaping: Shaping) {
        self.scratch
            .datapath
            .insert_pod(
                pod.endpoint(),
                &[pod.addresses.v4.into(), pod.addresses.v6.into()],
                shaping,
            )
            .expect("writing the pod with its shaping");
    }

    /// Runs `frame` through the program at `hook` (in the namespace, where
    /// the ifindexes are).
    fn try_run(&self, hook: Hook, frame: &[u8]) -> anyhow::Result<Outcome> {
        let (program, ifindex) = match hook {
            Hook::PodTc(pod) => (PROG_FROM_POD, pod.host_ifindex),
            Hook::PodXdp(pod) => (PROG_FROM_POD_XDP, pod.host_ifindex),
            Hook::Uplink => (PROG_FROM_UPLINK, self.uplink_ifindex),
            Hook::ToPod(pod) => (PROG_TO_POD, pod.host_ifindex),
        };
        let path = self.scratch.program_path(program);
        self.netns.run(|| match hook {
            Hook::PodXdp(_) => run_xdp(&path, frame, ifindex),
            Hook::PodTc(_) | Hook::Uplink | Hook::ToPod(_) => run_tc(&path, frame, ifindex),
        })
    }

    /// Runs `frame` at `hook` and checks what came out: the verdict, the
    /// frame the program left (`left`), and the counters it moved, by
    /// name, every other one unmoved. Returns the outcome for more checks.
    fn check(
        &self,
        case: &str,
        hook: Hook,
        frame: &[u8],
        verdict: u32,
        left: &[u8],
        counted: &[(&str, u64)],
    ) -> Outcome {
        let before = self.stats();
        let outcome = self.try_run(hook, frame).expect(case);
        assert_eq!(outcome.verdict, verdict, "{case}: verdict");
        assert_eq!(
            hex(&outcome.frame),
            hex(left),
            "{case}: the frame the program left"
        );
        assert_eq!(self.counted_since(&before), counted, "{case}: STATS");
        outcome
    }

    fn stats(&self) -> Stats {
        self.scratch.datapath.stats().expect("reading STATS")
    }

    /// The actions counted since `before`, by name, with their packets.
    fn counted_since(&self, before: &Stats) -> Vec<(&'static str, u64)> {
        let after = self.stats();
        action::NAMES
            .iter()
            .zip(after.iter().zip(before))
            .map(|(name, (after, before))| (*name, after.packets - before.packets))
            .filter(|(_, packets)| *packets > 0)
            .collect()
    }

    /// `conntrack` with the arguments in `line` (space-separated) in the
    /// node's namespace.
    fn conntrack(&self, line: &str) {
        let mut command = vec!["conntrack"];
        command.extend(line.split_whitespace());
        self.netns.exec(&command);
    }

    /// A conntrack entry as the host's stack would have made it: the
    /// original direction `orig`, the reply direction `reply` (other than
    /// `orig` reversed when the host translated the flow).
    fn track(&self, proto: &str, orig: Tuple, reply: Tuple) {
        let state = if proto == "tcp" {
            "--state ESTABLISHED"
        } else {
            ""
        };
        self.conntrack(&format!(
            "-I -p {proto} -s {} -d {} --sport {} --dport {} \
             -r {} -q {} --reply-port-src {} --reply-port-dst {} -t 300 {state}",
            orig.src,
            orig.dst,
            orig.sport,
            orig.dport,
            reply.src,
            reply.dst,
            reply.sport,
            reply.dport,
        ));
    }

    /// Deletes the entry whose original direction is `orig`.
    fn untrack(&self, proto: &str, orig: Tuple) {
        self.conntrack(&format!(
            "-D -p {proto} -s {} -d {} --sport {} --dport {}",
            orig.src, orig.dst, orig.sport, orig.dport
        ));
    }

    /// Runs each of `lines` (a command, space-separated) in the node's
    /// namespace.
    fn exec_lines(&self, lines: &[String]) {
        for line in lines {
            self.netns
                .exec(&line.split_whitespace().collect::<Vec<_>>());
        }
    }
}

/// Creates a veth pair in `netns` (the first end with `mac`), returns the
/// first end's ifindex.
fn add_veth(netns: &Netns, name: &str, mac: Mac, peer: &str) -> u32 {
    netns.exec(&[
        "ip",
        "link",
        "add",
        name,
        "address",
        &mac_text(mac),
        "type",
        "veth",
        "peer",
        "name",
        peer,
    ]);
    let shown = netns.exec(&["ip", "-j", "link", "show", "dev", name]);
    let links: serde_json::Value = serde_json::from_str(&shown).expect("ip -j output");
    links[0]["ifindex"]
        .as_u64()
        .and_then(|index| u32::try_from(index).ok())
        .unwrap_or_else(|| panic!("no ifindex for {name} in {shown}"))
}

fn mac_text(mac: Mac) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Bytes as hex, 16 a line: a differing frame shows where it differs.
fn hex(bytes: &[u8]) -> String {
    bytes
        .chunks(16)
        .map(|line| {
            line.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// One direction of a flow.
#[derive(Clone, Copy, Debug)]
struct Tuple {
    src: IpAddr,
    sport: u16,
    dst: IpAddr,
    dport: u16,
}

impl Tuple {
    fn new(src: IpAddr, sport: u16, dst: IpAddr, dport: u16) -> Self {
        Tuple {
            src,
            sport,
            dst,
            dport,
        }
    }

    fn reversed(self) -> Self {
        Tuple::new(self.dst, self.dport, self.src, self.sport)
    }

    /// An IP packet of this tuple, TCP with `flags`.
    fn tcp(self, flags: u8) -> (u16, Vec<u8>) {
        let segment = tcp(self.src, self.dst, self.sport, self.dport, flags);
        ip(self.src, self.dst, TTL, IPPROTO_TCP, &segment)
    }

    /// An IP packet of this tuple, UDP with a small payload.
    fn udp(self) -> (u16, Vec<u8>) {
        let datagram = udp(self.src, self.dst, self.sport, self.dport, b"query");
        ip(self.src, self.dst, TTL, IPPROTO_UDP, &datagram)
    }
}

/// Skips the test (returns None) unless root; else the node for `mode`.
fn node_or_skip(test: &str, mode: DatapathMode) -> Option<Node> {
    if !root_or_skip(test) {
        return None;
    }
    Some(Node::new(mode))
}

// ---- Neighbours: ARP and NDP answered in place ------------------------------

#[test]
fn arp_requests_are_answered_with_the_host_veth_mac() {
    let Some(node) = node_or_skip(
        "arp_requests_are_answered_with_the_host_veth_mac",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let a = &node.a;
    // For another pod and for an address outside: the pod must send both
    // to its host veth.
    for target in [POD_B.v4, OUTSIDE.v4] {
        let request = ethernet(
            BROADCAST,
            a.pod_mac,
            ETH_P_ARP,
            &arp(ARPOP_REQUEST, a.pod_mac, a.addresses.v4, [0; 6], target),
        );
        let reply = ethernet(
            a.pod_mac,
            a.host_mac,
            ETH_P_ARP,
            &arp(ARPOP_REPLY, a.host_mac, target, a.pod_mac, a.addresses.v4),
        );
        node.check(
            &format!("who-has {target}"),
            Hook::PodTc(a),
            &request,
            TC_ACT_REDIRECT,
            &reply,
            &[("arp_answered", 1)],
        );
    }
}

#[test]
fn arp_probes_and_announcements_pass_unchanged() {
    let Some(node) = node_or_skip(
        "arp_probes_and_announcements_pass_unchanged",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let a = &node.a;
    // A probe (sender 0.0.0.0, RFC 5227) and a gratuitous ARP (sender =
    // target): answering either would tell the pod its address is taken.
    let probe = arp(
        ARPOP_REQUEST,
        a.pod_mac,
        Ipv4Addr::UNSPECIFIED,
        [0; 6],
        a.addresses.v4,
    );
    let announcement = arp(
        ARPOP_REQUEST,
        a.pod_mac,
        a.addresses.v4,
        [0; 6],
        a.addresses.v4,
    );
    // A reply is not the datapath's to answer either.
    let reply = arp(ARPOP_REPLY, a.pod_mac, a.addresses.v4, a.host_mac, POD_B.v4);
    for (case, message) in [
        ("probe", probe),
        ("announcement", announcement),
        ("reply", reply),
    ] {
        let frame = ethernet(BROADCAST, a.pod_mac, ETH_P_ARP, &message);
        node.check(
            case,
            Hook::PodTc(a),
            &frame,
            TC_NEXT,
            &frame,
            &[("passed_to_stack", 1)],
        );
    }
}

#[test]
fn neighbour_solicitations_become_advertisements_of_the_host_veth_mac() {
    let Some(node) = node_or_skip(
        "neighbour_solicitations_become_advertisements_of_the_host_veth_mac",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let a = &node.a;
    let link_local_a: Ipv6Addr = "fe80::a".parse().expect("address");
    let gateway: Ipv6Addr = "fe80::1".parse().expect("address");
    // From the pod's own address for another pod, and from its link-local
    // address for its gateway (how a default route is resolved).
    for (asker, target) in [(a.addresses.v6, POD_B.v6), (link_local_a, gateway)] {
        let solicitation = ethernet(
            multicast_mac(solicited_node(target)),
            a.pod_mac,
            ETH_P_IPV6,
            &neighbour_solicitation(asker, target, Some(a.pod_mac)),
        );
        let advertisement = ethernet(
            a.pod_mac,
            a.host_mac,
            ETH_P_IPV6,
            &neighbour_advertisement(asker, target, a.host_mac),
        );
        let case = format!("{asker} asks for {target}");
        let outcome = node.check(
            &case,
            Hook::PodTc(a),
            &solicitation,
            TC_ACT_REDIRECT,
            &advertisement,
            &[("nd_answered", 1)],
        );
        // The equality above covers the checksum; checked on its own too,
        // so that a failure says so.
        let message = &outcome.frame[ETH_LEN + IPV6_LEN..];
        let covered = [
            pseudo_header(target.into(), asker.into(), IPPROTO_ICMPV6, message.len()),
            message.to_vec(),
        ]
        .concat();
        assert_eq!(checksum(&covered), 0, "{case}: ICMPv6 checksum");
    }
}

#[test]
fn duplicate_address_detection_passes_unchanged() {
    let Some(node) = node_or_skip(
        "duplicate_address_detection_passes_unchanged",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let a = &node.a;
    // DAD comes from :: and has no source link-layer option (RFC 4862); one
    // with the option has the exact shape the datapath answers, so it
    // reaches the check for the unspecified source too.
    for (case, option) in [("plain", None), ("with an option", Some(a.pod_mac))] {
        let frame = ethernet(
            multicast_mac(solicited_node(a.addresses.v6)),
            a.pod_mac,
            ETH_P_IPV6,
            &neighbour_solicitation(Ipv6Addr::UNSPECIFIED, a.addresses.v6, option),
        );
        node.check(
            case,
            Hook::PodTc(a),
            &frame,
            TC_NEXT,
            &frame,
            &[("passed_to_stack", 1)],
        );
    }
}

// ---- Between local pods ----------------------------------------------------------

#[test]
fn packets_between_pods_are_redirected_with_the_peers_macs() {
    let Some(node) = node_or_skip(
        "packets_between_pods_are_redirected_with_the_peers_macs",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    let mut delivered = 0;
    for family in FAMILIES {
        let flow = Tuple::new(a.ip(family), 40000, b.ip(family), 8080);
        for (case, packet) in [
            ("TCP SYN", flow.tcp(TCP_SYN)),
            ("TCP ACK", flow.tcp(TCP_ACK)),
            ("UDP", flow.udp()),
        ] {
            let frame = a.sends(packet);
            node.check(
                &format!("{family:?} {case}"),
                Hook::PodTc(a),
                &frame,
                TC_ACT_REDIRECT,
                // The IP header is untouched: between two local pods there
                // is no routing hop.
                &b.receives(&frame),
                &[("redirected", 1)],
            );
            delivered += 1;
        }
    }
    // IPv6 BIG TCP: the kernel marks a segment above 64 KiB with a
    // Hop-by-Hop header holding only a jumbo payload option; the datapath
    // looks past it to the TCP header.
    let flow = Tuple::new(a.ip(Family::V6), 40000, b.ip(Family::V6), 8080);
    let jumbo = with_jumbo_hop_by_hop(&a.sends(flow.tcp(TCP_ACK)));
    node.check(
        "IPv6 BIG TCP segment",
        Hook::PodTc(a),
        &jumbo,
        TC_ACT_REDIRECT,
        &b.receives(&jumbo),
        &[("redirected", 1)],
    );
    delivered += 1;
    let received = node
        .scratch
        .datapath
        .slot_counters(b.slot)
        .expect("B's counters");
    assert_eq!(received.rx_packets, delivered, "B's per-pod rx counter");
}

/// An IPv6 frame as IPv6 BIG TCP sends it: payload length 0 and a
/// Hop-by-Hop header with a jumbo payload option (RFC 2675) carrying the
/// length (here the real, small one: the program reads only the headers).
fn with_jumbo_hop_by_hop(frame: &[u8]) -> Vec<u8> {
    let ip = ETH_LEN;
    let (next_header, payload) = (frame[ip + 6], &frame[ip + IPV6_LEN..]);
    let jumbo_len = (payload.len() + 8) as u32;
    let mut out = frame[..ip + IPV6_LEN].to_vec();
    out[ip + 4..ip + 6].copy_from_slice(&[0, 0]);
    out[ip + 6] = 0;
    out.extend_from_slice(&[next_header, 0, 0xc2, 4]);
    out.extend_from_slice(&jumbo_len.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Pods whose traffic the bandwidth plugin shapes: what a redirect would
/// carry past the qdiscs on their host veths goes to the stack instead,
/// unchanged (tc "next", so the `ingress` qdisc shaping a sender runs; XDP
/// pass), counted as `shaped_to_stack`. What the stack would get anyway,
/// and the neighbour answers, are as for any pod.
#[test]
fn traffic_of_shaped_pods_is_left_to_the_stack_and_its_qdiscs() {
    let name = "traffic_of_shaped_pods_is_left_to_the_stack_and_its_qdiscs";
    let (Some(tc), Some(xdp)) = (
        node_or_skip(name, DatapathMode::Tc),
        node_or_skip(name, DatapathMode::Xdp),
    ) else {
        return;
    };
    let shaped_into = Shaping {
        ingress: true,
        egress: false,
    };
    let shaped_out_of = Shaping {
        ingress: false,
        egress: true,
    };
    for family in FAMILIES {
        let (a, b) = (&tc.a, &tc.b);
        let to_b = a.sends(Tuple::new(a.ip(family), 40000, b.ip(family), 8080).udp());
        let to_remote = a.sends(Tuple::new(a.ip(family), 40000, REMOTE_POD.of(family), 8080).udp());
        let shaped = [("shaped_to_stack", 1)];

        // B's ingress shaped: A's packets for B, and the uplink's.
        tc.shape(b, shaped_into);
        tc.check(
            "A to ingress-shaped B",
            Hook::PodTc(a),
            &to_b,
            TC_NEXT,
            &to_b,
            &shaped,
        );
        let from_far = from_remote(REMOTE_POD.of(family), b.ip(family), TTL);
        tc.check(
            "remote pod to ingress-shaped B",
            Hook::Uplink,
            &from_far,
            TC_NEXT,
            &from_far,
            &shaped,
        );
        tc.shape(b, Shaping::default());
        tc.check(
            "A to B, unshaped again",
            Hook::PodTc(a),
            &to_b,
            TC_ACT_REDIRECT,
            &b.receives(&to_b),
            &[("redirected", 1)],
        );

        // A's egress shaped: to a local pod and to another node's.
        tc.shape(a, shaped_out_of);
        tc.check(
            "egress-shaped A to B",
            Hook::PodTc(a),
            &to_b,
            TC_NEXT,
            &to_b,
            &shaped,
        );
        tc.check(
            "egress-shaped A to a remote pod",
            Hook::PodTc(a),
            &to_remote,
            TC_NEXT,
            &to_remote,
            &shaped,
        );
        let foreign = a.sends(Tuple::new(OUTSIDE.of(family), 40000, b.ip(family), 80).udp());
        tc.check(
            "egress-shaped A still checked for its source",
            Hook::PodTc(a),
            &foreign,
            TC_ACT_SHOT,
            &foreign,
            &[("dropped", 1)],
        );
        tc.shape(a, Shaping::default());

        // XDP mode: a redirect skips every qdisc, so the stack takes both.
        let (a, b) = (&xdp.a, &xdp.b);
        let to_b = a.sends(Tuple::new(a.ip(family), 40000, b.ip(family), 8080).udp());
        for (case, pod, shaping) in [
            ("XDP: A to ingress-shaped B", b, shaped_into),
            ("XDP: egress-shaped A to B", a, shaped_out_of),
        ] {
            xdp.shape(pod, shaping);
            xdp.check(case, Hook::PodXdp(a), &to_b, XDP_PASS, &to_b, &shaped);
            xdp.shape(pod, Shaping::default());
        }
    }
}

#[test]
fn packets_for_no_local_pod_pass_unchanged() {
    let Some(node) = node_or_skip("packets_for_no_local_pod_pass_unchanged", DatapathMode::Tc)
    else {
        return;
    };
    let a = &node.a;
    for family in FAMILIES {
        // An address outside, one of the subnet nobody has, the pod itself.
        for (case, dst) in [
            ("outside", OUTSIDE.of(family)),
            ("unused", UNUSED.of(family)),
            ("itself", a.ip(family)),
        ] {
            let frame = a.sends(Tuple::new(a.ip(family), 40000, dst, 80).tcp(TCP_SYN));
            node.check(
                &format!("{family:?} to {case}"),
                Hook::PodTc(a),
                &frame,
                TC_NEXT,
                &frame,
                &[("passed_to_stack", 1)],
            );
        }
    }
}

#[test]
fn short_icmpv6_between_pods_is_redirected() {
    let Some(node) = node_or_skip("short_icmpv6_between_pods_is_redirected", DatapathMode::Tc)
    else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    // 8 bytes of ICMPv6, shorter than any neighbour solicitation: it must
    // not be taken for a truncated one. ICMP echo of IPv4 likewise.
    for family in FAMILIES {
        let (proto, echo) = echo_request(a.ip(family), b.ip(family));
        let frame = a.sends(ip(a.ip(family), b.ip(family), TTL, proto, &echo));
        node.check(
            &format!("{family:?} echo request"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_REDIRECT,
            &b.receives(&frame),
            &[("redirected", 1)],
        );
    }
}

// ---- Source addresses -------------------------------------------------------------

#[test]
fn packets_from_an_address_not_the_pods_own_are_dropped() {
    let Some(node) = node_or_skip(
        "packets_from_an_address_not_the_pods_own_are_dropped",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    for family in FAMILIES {
        // An unused address and another pod's, to a pod and to the outside.
        for (case, src) in [("unused", UNUSED.of(family)), ("B's", b.ip(family))] {
            for dst in [b.ip(family), OUTSIDE.of(family)] {
                let frame = a.sends(Tuple::new(src, 40000, dst, 80).udp());
                node.check(
                    &format!("{family:?} from {case} address to {dst}"),
                    Hook::PodTc(a),
                    &frame,
                    TC_ACT_SHOT,
                    &frame,
                    &[("dropped", 1)],
                );
            }
        }
    }
}

#[test]
fn link_local_sources_reach_only_the_link() {
    let Some(node) = node_or_skip("link_local_sources_reach_only_the_link", DatapathMode::Tc)
    else {
        return;
    };
    let a = &node.a;
    let link_local_a: Ipv6Addr = "fe80::a".parse().expect("address");
    let all_routers: Ipv6Addr = "ff02::2".parse().expect("address");
    // A router solicitation (type 133, the source link-layer option).
    let body = [&[0, 0, 0, 0, 1, 1][..], &a.pod_mac].concat();
    let message = icmpv6(link_local_a, all_routers, 133, 0, &body);
    let to_routers = a.sends((
        ETH_P_IPV6,
        ipv6(
            link_local_a,
            all_routers,
            ND_HOP_LIMIT,
            IPPROTO_ICMPV6,
            &message,
        ),
    ));
    node.check(
        "router solicitation to ff02::2",
        Hook::PodTc(a),
        &to_routers,
        TC_NEXT,
        &to_routers,
        &[("passed_to_stack", 1)],
    );
    // A link-local source must never be forwarded: to a pod or outside.
    for dst in [POD_B.of(Family::V6), OUTSIDE.of(Family::V6)] {
        let frame = a.sends(Tuple::new(link_local_a.into(), 40000, dst, 80).udp());
        node.check(
            &format!("link-local to {dst}"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_SHOT,
            &frame,
            &[("dropped", 1)],
        );
    }
}

// ---- Malformed and unknown frames -----------------------------------------------------

#[test]
fn frames_the_datapath_cannot_judge_pass_unchanged() {
    let Some(node) = node_or_skip(
        "frames_the_datapath_cannot_judge_pass_unchanged",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    let udp_v4 = Tuple::new(a.ip(Family::V4), 40000, b.ip(Family::V4), 80).udp();
    // A VLAN tag in front of IPv4 (a pod never sends one; the host decides).
    let tagged = ethernet(
        a.host_mac,
        a.pod_mac,
        ETH_P_8021Q,
        &[&[0, 100][..], &ETH_P_IP.to_be_bytes(), &udp_v4.1].concat(),
    );
    // An ARP request cut short.
    let short_arp = ethernet(
        BROADCAST,
        a.pod_mac,
        ETH_P_ARP,
        &arp(ARPOP_REQUEST, a.pod_mac, a.addresses.v4, [0; 6], POD_B.v4)[..20],
    );
    let unknown = ethernet(a.host_mac, a.pod_mac, 0x88b5, b"local experimental");
    let mut cases = vec![
        ("VLAN-tagged".to_string(), tagged),
        ("short ARP".to_string(), short_arp),
        ("unknown ethertype".to_string(), unknown),
    ];
    // A whole IP header, the TCP or UDP one cut short, between two pods:
    // conntrack cannot be asked, the stack takes it.
    for family in FAMILIES {
        let flow = Tuple::new(a.ip(family), 40000, b.ip(family), 80);
        let header_len = ETH_LEN + family.ip_header_len();
        for (proto, frame) in [
            ("TCP", a.sends(flow.tcp(TCP_ACK))),
            ("UDP", a.sends(flow.udp())),
        ] {
            cases.push((
                format!("{family:?} {proto}, 3 bytes of it"),
                frame[..header_len + 3].to_vec(),
            ));
        }
    }
    for (case, frame) in cases {
        node.check(
            &case,
            Hook::PodTc(a),
            &frame,
            TC_NEXT,
            &frame,
            &[("passed_to_stack", 1)],
        );
    }
}

// ---- Cross-node: from a pod to another node, from the uplink to a pod ---------------------

#[test]
fn packets_for_another_nodes_pod_leave_by_the_kernels_route() {
    let Some(node) = node_or_skip(
        "packets_for_another_nodes_pod_leave_by_the_kernels_route",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let a = &node.a;
    let to = |family: Family, dst: DualStack, ttl: u8| {
        let datagram = udp(a.ip(family), dst.of(family), 40000, 8080, b"query");
        a.sends(ip(
            a.ip(family),
            dst.of(family),
            ttl,
            IPPROTO_UDP,
            &datagram,
        ))
    };
    // Forwarding off and no route yet: the FIB has no answer, the stack
    // takes the packet as it is.
    for family in FAMILIES {
        let frame = to(family, REMOTE_POD, TTL);
        node.check(
            &format!("{family:?} without a route"),
            Hook::PodTc(a),
            &frame,
            TC_NEXT,
            &frame,
            &[("remote_passed_to_stack", 1)],
        );
    }
    // The routes the agent writes via the other nodes (REMOTE_CIDRS), and
    // REMOTE_NODE's MAC known (UNRESOLVED_NODE's not).
    let mut setup: Vec<String> = vec![
        "sysctl -qw net.ipv4.conf.all.forwarding=1".into(),
        "sysctl -qw net.ipv6.conf.all.forwarding=1".into(),
        "ip link set uplink-peer up".into(),
        "ip link set uplink up".into(),
        format!("ip addr add {}/24 dev uplink", THIS_NODE.v4),
        format!("ip addr add {}/64 dev uplink nodad", THIS_NODE.v6),
    ];
    for family in FAMILIES {
        setup.push(format!(
            "ip neigh add {} lladdr {} dev uplink nud permanent",
            REMOTE_NODE.of(family),
            mac_text(REMOTE_NODE_MAC)
        ));
    }
    for (cidr, via) in REMOTE_CIDRS {
        setup.push(format!("ip route add {cidr} via {via} dev uplink"));
    }
    node.exec_lines(&setup);
    for family in FAMILIES {
        // Resolved: the MACs the FIB found, one hop older (built anew here
        // with TTL 63 and its checksum from scratch), bpf_redirect.
        let frame = to(family, REMOTE_POD, TTL);
        let routed = with_macs(
            &to(family, REMOTE_POD, TTL - 1),
            REMOTE_NODE_MAC,
            UPLINK_MAC,
        );
        let outcome = node.check(
            &format!("{family:?} to a resolved next hop"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_REDIRECT,
            &routed,
            &[("to_remote_node", 1)],
        );
        if family == Family::V4 {
            assert_eq!(
                checksum(&outcome.frame[ETH_LEN..ETH_LEN + IPV4_LEN]),
                0,
                "IPv4 header checksum after the TTL decrement"
            );
        }
        // Unresolved: one hop older, MACs left for bpf_redirect_neigh.
        let frame = to(family, UNRESOLVED_POD, TTL);
        node.check(
            &format!("{family:?} to an unresolved next hop"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_REDIRECT,
            &to(family, UNRESOLVED_POD, TTL - 1),
            &[("to_remote_node", 1)],
        );
        // Expiring: the stack answers it with ICMP time exceeded.
        let frame = to(family, REMOTE_POD, 1);
        node.check(
            &format!("{family:?} with TTL 1"),
            Hook::PodTc(a),
            &frame,
            TC_NEXT,
            &frame,
            &[("remote_passed_to_stack", 1)],
        );
    }
}

/// A frame from another node on the uplink, addressed to this node's
/// uplink (the host's MAC: test_run's skb then gets PACKET_HOST).
fn from_remote(src: IpAddr, dst: IpAddr, ttl: u8) -> Vec<u8> {
    let datagram = udp(src, dst, 8080, 40000, b"answer");
    let (ethertype, packet) = ip(src, dst, ttl, IPPROTO_UDP, &datagram);
    ethernet(UPLINK_MAC, REMOTE_NODE_MAC, ethertype, &packet)
}

#[test]
fn uplink_packets_from_remote_pods_are_redirected_one_hop_older() {
    let Some(node) = node_or_skip(
        "uplink_packets_from_remote_pods_are_redirected_one_hop_older",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let b = &node.b;
    for family in FAMILIES {
        let (src, dst) = (REMOTE_POD.of(family), b.ip(family));
        let frame = from_remote(src, dst, TTL);
        // TTL (hop limit) one less, the IPv4 checksum patched: built anew
        // here with TTL 63 and a checksum computed from scratch.
        let forwarded = b.receives(&from_remote(src, dst, TTL - 1));
        let outcome = node.check(
            &format!("{family:?} remote pod to B"),
            Hook::Uplink,
            &frame,
            TC_ACT_REDIRECT,
            &forwarded,
            &[("uplink_to_pod", 1)],
        );
        if family == Family::V4 {
            assert_eq!(
                checksum(&outcome.frame[ETH_LEN..ETH_LEN + IPV4_LEN]),
                0,
                "IPv4 header checksum after the TTL decrement"
            );
        }
    }
    let received = node
        .scratch
        .datapath
        .slot_counters(b.slot)
        .expect("B's counters");
    assert_eq!(received.rx_packets, 2, "B's per-pod rx counter");
}

#[test]
fn ttl_decrements_keep_the_ipv4_checksum_valid_across_the_carry() {
    let Some(node) = node_or_skip(
        "ttl_decrements_keep_the_ipv4_checksum_valid_across_the_carry",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let b = &node.b;
    let (src, dst) = (REMOTE_POD.v4, b.addresses.v4);
    let datagram = udp(src.into(), dst.into(), 8080, 40000, b"answer");
    let packet = |id: u16, ttl: u8| ipv4_with_id(src, dst, ttl, IPPROTO_UDP, id, &datagram);
    // The decrement adds 0x0100 to the checksum: headers whose checksum is
    // at, just under and past the point where that carries (the
    // identification picks the checksum).
    for wanted in [0x0000, 0x00ff, 0xfe00, 0xfeff, 0xff00, 0xff01, 0xfffe] {
        let id = (0..=u16::MAX)
            .find(|id| {
                let header = packet(*id, TTL);
                u16::from_be_bytes([header[10], header[11]]) == wanted
            })
            .expect("an identification for the checksum");
        let frame = ethernet(UPLINK_MAC, REMOTE_NODE_MAC, ETH_P_IP, &packet(id, TTL));
        let outcome = node.try_run(Hook::Uplink, &frame).expect("test run");
        assert_eq!(outcome.verdict, TC_ACT_REDIRECT, "checksum {wanted:#06x}");
        let header = &outcome.frame[ETH_LEN..ETH_LEN + IPV4_LEN];
        assert_eq!(header[8], TTL - 1, "checksum {wanted:#06x}: TTL");
        assert_eq!(
            checksum(header),
            0,
            "checksum {wanted:#06x} became {:#04x}{:02x}",
            header[10],
            header[11]
        );
    }
}

#[test]
fn uplink_leaves_to_the_stack_what_is_not_a_remote_pods_for_a_local_pod() {
    let Some(node) = node_or_skip(
        "uplink_leaves_to_the_stack_what_is_not_a_remote_pods_for_a_local_pod",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let b = &node.b;
    for family in FAMILIES {
        let (remote, local) = (REMOTE_POD.of(family), b.ip(family));
        let to_other_host = with_macs(
            &from_remote(remote, local, TTL),
            [0x02, 0, 0, 0, 0, 0x77],
            REMOTE_NODE_MAC,
        );
        for (case, frame) in [
            // Expiring: the stack sends the time exceeded.
            ("TTL 1", from_remote(remote, local, 1)),
            // From a node's own address or the outside: the replies take
            // the stack, so this direction must too.
            (
                "from a node",
                from_remote(REMOTE_NODE.of(family), local, TTL),
            ),
            ("from outside", from_remote(OUTSIDE.of(family), local, TTL)),
            // Not for a local pod.
            ("to no pod", from_remote(remote, UNUSED.of(family), TTL)),
            // Addressed to another host's MAC (PACKET_OTHERHOST).
            ("to another MAC", to_other_host),
        ] {
            node.check(
                &format!("{family:?} {case}"),
                Hook::Uplink,
                &frame,
                TC_NEXT,
                &frame,
                &[],
            );
        }
    }
}

#[test]
fn uplink_hands_nothing_to_pods_in_xdp_mode() {
    let Some(node) = node_or_skip(
        "uplink_hands_nothing_to_pods_in_xdp_mode",
        DatapathMode::Xdp,
    ) else {
        return;
    };
    // XDP mode sends pods' packets for other nodes through the stack, so
    // the replies must take it too.
    for family in FAMILIES {
        let frame = from_remote(REMOTE_POD.of(family), node.b.ip(family), TTL);
        node.check(
            &format!("{family:?} remote pod to B"),
            Hook::Uplink,
            &frame,
            TC_NEXT,
            &frame,
            &[],
        );
    }
}

// ---- Flows the host's conntrack tracks -------------------------------------------------

const SERVICE_PORT: u16 = 80;
const BACKEND_PORT: u16 = 8080;

#[test]
fn replies_of_translated_flows_go_to_the_stack() {
    let Some(node) = node_or_skip(
        "replies_of_translated_flows_go_to_the_stack",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    for family in FAMILIES {
        // A asked the ClusterIP, the host sent it to B: B's replies must
        // meet the entry to come back from the ClusterIP.
        for proto in ["tcp", "udp"] {
            let request = Tuple::new(a.ip(family), 40000, CLUSTER_IP.of(family), SERVICE_PORT);
            let reply = Tuple::new(b.ip(family), BACKEND_PORT, a.ip(family), 40000);
            node.track(proto, request, reply);
            let packets = if proto == "tcp" {
                vec![
                    ("SYN-ACK", reply.tcp(TCP_SYN | TCP_ACK)),
                    ("ACK", reply.tcp(TCP_ACK)),
                ]
            } else {
                vec![("datagram", reply.udp())]
            };
            for (case, packet) in packets {
                let frame = b.sends(packet);
                node.check(
                    &format!("{family:?} {proto} {case} of B's reply"),
                    Hook::PodTc(b),
                    &frame,
                    TC_NEXT,
                    &frame,
                    &[("translated_to_stack", 1)],
                );
            }
            // The same packets of a flow the host never saw: fast path.
            let untracked = Tuple::new(b.ip(family), BACKEND_PORT, a.ip(family), 40001);
            let packet = if proto == "tcp" {
                untracked.tcp(TCP_ACK)
            } else {
                untracked.udp()
            };
            let frame = b.sends(packet);
            node.check(
                &format!("{family:?} {proto} without an entry"),
                Hook::PodTc(b),
                &frame,
                TC_ACT_REDIRECT,
                &a.receives(&frame),
                &[("redirected", 1)],
            );
        }
    }
}

#[test]
fn packets_of_tracked_flows_go_to_the_stack() {
    let Some(node) = node_or_skip("packets_of_tracked_flows_go_to_the_stack", DatapathMode::Tc)
    else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    for family in FAMILIES {
        for proto in ["tcp", "udp"] {
            // A flow between the two pods the host saw untranslated (its
            // first packet went through the stack): both directions must
            // keep meeting the entry.
            let forward = Tuple::new(a.ip(family), 40010, b.ip(family), 9000);
            node.track(proto, forward, forward.reversed());
            for (who, sender, tuple) in [("A", a, forward), ("B", b, forward.reversed())] {
                let packet = if proto == "tcp" {
                    tuple.tcp(TCP_ACK)
                } else {
                    tuple.udp()
                };
                let frame = sender.sends(packet);
                node.check(
                    &format!("{family:?} {proto} from {who}"),
                    Hook::PodTc(sender),
                    &frame,
                    TC_NEXT,
                    &frame,
                    &[("tracked_to_stack", 1)],
                );
            }
        }
    }
}

#[test]
fn tcp_verdicts_hold_until_the_next_syn() {
    let Some(node) = node_or_skip("tcp_verdicts_hold_until_the_next_syn", DatapathMode::Tc) else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    for family in FAMILIES {
        let forward = Tuple::new(a.ip(family), 40020, b.ip(family), 9000);
        let reply = forward.reversed();
        node.track("tcp", forward, reply);
        let ack = b.sends(reply.tcp(TCP_ACK));
        let syn_ack = b.sends(reply.tcp(TCP_SYN | TCP_ACK));
        node.check(
            &format!("{family:?} ACK of a tracked flow"),
            Hook::PodTc(b),
            &ack,
            TC_NEXT,
            &ack,
            &[("tracked_to_stack", 1)],
        );
        // The entry goes; TCP_FLOWS still says "tracked" for this direction
        // until a SYN asks conntrack again (a new connection on the same
        // ports starts with one).
        node.untrack("tcp", forward);
        node.check(
            &format!("{family:?} ACK after the entry went"),
            Hook::PodTc(b),
            &ack,
            TC_NEXT,
            &ack,
            &[("tracked_to_stack", 1)],
        );
        node.check(
            &format!("{family:?} SYN-ACK after the entry went"),
            Hook::PodTc(b),
            &syn_ack,
            TC_ACT_REDIRECT,
            &a.receives(&syn_ack),
            &[("redirected", 1)],
        );
        node.check(
            &format!("{family:?} ACK after the SYN-ACK"),
            Hook::PodTc(b),
            &ack,
            TC_ACT_REDIRECT,
            &a.receives(&ack),
            &[("redirected", 1)],
        );
    }
}

#[test]
fn icmp_errors_are_judged_by_the_packet_they_quote() {
    let Some(node) = node_or_skip(
        "icmp_errors_are_judged_by_the_packet_they_quote",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    for family in FAMILIES {
        // A sent UDP to the ClusterIP, the host sent it on to B, where
        // nothing listens: B's port unreachable quotes A -> B:8080 and must
        // reach A through the stack, rewritten to come from the ClusterIP.
        let request = Tuple::new(a.ip(family), 40030, CLUSTER_IP.of(family), 53);
        let translated = Tuple::new(a.ip(family), 40030, b.ip(family), BACKEND_PORT);
        node.track("udp", request, translated.reversed());
        let unreachable_about = |quoted: Tuple| {
            let (_, quoted_packet) = quoted.udp();
            let (proto, message) = port_unreachable(b.ip(family), a.ip(family), &quoted_packet);
            b.sends(ip(b.ip(family), a.ip(family), TTL, proto, &message))
        };
        let frame = unreachable_about(translated);
        node.check(
            &format!("{family:?} port unreachable of a translated flow"),
            Hook::PodTc(b),
            &frame,
            TC_NEXT,
            &frame,
            &[("translated_to_stack", 1)],
        );
        // One about a flow the host never saw keeps the fast path.
        let frame = unreachable_about(Tuple::new(a.ip(family), 40031, b.ip(family), BACKEND_PORT));
        node.check(
            &format!("{family:?} port unreachable of a direct flow"),
            Hook::PodTc(b),
            &frame,
            TC_ACT_REDIRECT,
            &a.receives(&frame),
            &[("redirected", 1)],
        );
    }
}

#[test]
fn uplink_replies_of_translated_flows_go_to_the_stack() {
    let Some(node) = node_or_skip(
        "uplink_replies_of_translated_flows_go_to_the_stack",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let a = &node.a;
    for family in FAMILIES {
        // A's ClusterIP flow went to a backend on another node; its reply
        // comes back over the uplink and must meet this node's entry.
        let request = Tuple::new(a.ip(family), 40000, CLUSTER_IP.of(family), SERVICE_PORT);
        let reply = Tuple::new(REMOTE_POD.of(family), BACKEND_PORT, a.ip(family), 40000);
        node.track("udp", request, reply);
        let frame = from_remote(reply.src, reply.dst, TTL);
        node.check(
            &format!("{family:?} remote backend's reply"),
            Hook::Uplink,
            &frame,
            TC_NEXT,
            // Untouched: not even the TTL, the stack forwards it.
            &frame,
            &[("translated_to_stack", 1)],
        );
    }
}

// ---- XDP mode ------------------------------------------------------------------------------

#[test]
fn xdp_packets_between_pods_are_redirected() {
    let Some(node) = node_or_skip("xdp_packets_between_pods_are_redirected", DatapathMode::Xdp)
    else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    for family in FAMILIES {
        let flow = Tuple::new(a.ip(family), 40000, b.ip(family), 8080);
        for (case, packet) in [("TCP", flow.tcp(TCP_SYN)), ("UDP", flow.udp())] {
            let frame = a.sends(packet);
            node.check(
                &format!("{family:?} {case}"),
                Hook::PodXdp(a),
                &frame,
                XDP_REDIRECT,
                &b.receives(&frame),
                &[("redirected", 1)],
            );
        }
    }
    // XDP finds the sender's slot itself (HOST_VETHS): both pods' counters move.
    let datapath = &node.scratch.datapath;
    assert_eq!(datapath.slot_counters(a.slot).expect("A").tx_packets, 4);
    assert_eq!(datapath.slot_counters(b.slot).expect("B").rx_packets, 4);
}

#[test]
fn xdp_mode_enforces_policy_on_both_pods() {
    let Some(node) = node_or_skip("xdp_mode_enforces_policy_on_both_pods", DatapathMode::Xdp)
    else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    // A may open TCP 8080 and 9090 in the cluster; B takes only 8080 in.
    let ports = |ports: &[u16]| {
        let ranges: Vec<PolicyPortRange> = ports.iter().map(|p| tcp_port(*p)).collect();
        [
            rule("10.244.0.0/16", &ranges),
            rule("fd00:244::/32", &ranges),
        ]
    };
    node.set_policy(a, None, Some(&ports(&[8080, 9090])));
    node.set_policy(b, Some(&ports(&[8080])), None);
    for family in FAMILIES {
        for (port, verdict, counted) in [
            (8080, XDP_REDIRECT, "redirected"),
            // A's egress allows it, B's ingress does not.
            (9090, XDP_DROP, "policy_denied"),
            // A's egress does not.
            (7070, XDP_DROP, "policy_denied"),
        ] {
            let frame = a.sends(Tuple::new(a.ip(family), 40060, b.ip(family), port).tcp(TCP_SYN));
            node.check(
                &format!("{family:?} A's SYN to B:{port}"),
                Hook::PodXdp(a),
                &frame,
                verdict,
                &b.receives(&frame),
                &[(counted, 1)],
            );
        }
    }
    assert_eq!(node.policy_drops(a), (0, 2));
    assert_eq!(node.policy_drops(b), (2, 0));
}

#[test]
fn xdp_neighbour_questions_are_answered_with_xdp_tx() {
    let Some(node) = node_or_skip(
        "xdp_neighbour_questions_are_answered_with_xdp_tx",
        DatapathMode::Xdp,
    ) else {
        return;
    };
    let a = &node.a;
    let request = ethernet(
        BROADCAST,
        a.pod_mac,
        ETH_P_ARP,
        &arp(ARPOP_REQUEST, a.pod_mac, a.addresses.v4, [0; 6], POD_B.v4),
    );
    let reply = ethernet(
        a.pod_mac,
        a.host_mac,
        ETH_P_ARP,
        &arp(ARPOP_REPLY, a.host_mac, POD_B.v4, a.pod_mac, a.addresses.v4),
    );
    node.check(
        "ARP",
        Hook::PodXdp(a),
        &request,
        XDP_TX,
        &reply,
        &[("arp_answered", 1)],
    );
    let solicitation = ethernet(
        multicast_mac(solicited_node(POD_B.v6)),
        a.pod_mac,
        ETH_P_IPV6,
        &neighbour_solicitation(a.addresses.v6, POD_B.v6, Some(a.pod_mac)),
    );
    let advertisement = ethernet(
        a.pod_mac,
        a.host_mac,
        ETH_P_IPV6,
        &neighbour_advertisement(a.addresses.v6, POD_B.v6, a.host_mac),
    );
    node.check(
        "neighbour solicitation",
        Hook::PodXdp(a),
        &solicitation,
        XDP_TX,
        &advertisement,
        &[("nd_answered", 1)],
    );
}

#[test]
fn xdp_packets_from_an_address_not_the_pods_own_are_dropped() {
    let Some(node) = node_or_skip(
        "xdp_packets_from_an_address_not_the_pods_own_are_dropped",
        DatapathMode::Xdp,
    ) else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    for family in FAMILIES {
        for (case, src) in [("unused", UNUSED.of(family)), ("B's", b.ip(family))] {
            let frame = a.sends(Tuple::new(src, 40000, b.ip(family), 80).udp());
            node.check(
                &format!("{family:?} from {case} address"),
                Hook::PodXdp(a),
                &frame,
                XDP_DROP,
                &frame,
                &[("dropped", 1)],
            );
        }
    }
}

#[test]
fn xdp_checks_sources_in_the_senders_pod_sources_entry() {
    let Some(node) = node_or_skip(
        "xdp_checks_sources_in_the_senders_pod_sources_entry",
        DatapathMode::Xdp,
    ) else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    let datapath = &node.scratch.datapath;
    let from = |src: Ipv4Addr| a.sends(Tuple::new(src.into(), 40000, b.ip(Family::V4), 80).udp());
    // A with five more IPv4 addresses: its entry holds four of the six and
    // says there are more, so the other two are checked in ENDPOINTS_V4.
    let own: Vec<Ipv4Addr> = [a.addresses.v4]
        .into_iter()
        .chain((10..15).map(|n| Ipv4Addr::new(10, 244, 1, n)))
        .collect();
    let addresses: Vec<IpAddr> = own.iter().map(|ip| (*ip).into()).collect();
    datapath
        .insert_pod(a.endpoint(), &addresses, Shaping::default())
        .expect("A with six addresses");
    let entry = datapath.sources(a.slot).expect("A's sources");
    assert_ne!(entry.flags & SOURCES_F_MORE, 0, "{entry:?}");
    for src in &own {
        let frame = from(*src);
        node.check(
            &format!("from A's {src}"),
            Hook::PodXdp(a),
            &frame,
            XDP_REDIRECT,
            &b.receives(&frame),
            &[("redirected", 1)],
        );
    }
    let frame = from(UNUSED.v4);
    node.check(
        "from the unused address",
        Hook::PodXdp(a),
        &frame,
        XDP_DROP,
        &frame,
        &[("dropped", 1)],
    );
    // The entry decides when it is complete: rewritten to hold only the
    // unused address, that one passes and A's first address is dropped,
    // though ENDPOINTS_V4 still maps it to A.
    datapath
        .insert_pod(a.endpoint(), &[UNUSED.v4.into()], Shaping::default())
        .expect("A's entry rewritten");
    let frame = from(UNUSED.v4);
    node.check(
        "from the address the entry now holds",
        Hook::PodXdp(a),
        &frame,
        XDP_REDIRECT,
        &b.receives(&frame),
        &[("redirected", 1)],
    );
    let frame = from(a.addresses.v4);
    node.check(
        "from the address the entry no longer holds",
        Hook::PodXdp(a),
        &frame,
        XDP_DROP,
        &frame,
        &[("dropped", 1)],
    );
}

/// Cut-short IP headers run in XDP mode: test_run (Linux 6.18 here)
/// refuses an skb whose ethertype is IPv4 or IPv6 without a whole header
/// of it (EINVAL), so `from_pod` cannot be handed one; `from_pod_xdp` makes the
/// same decision (`decide`) on the same bytes.
#[test]
fn xdp_truncated_ip_headers_are_dropped() {
    let Some(node) = node_or_skip("xdp_truncated_ip_headers_are_dropped", DatapathMode::Xdp) else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    let full_v4 = a.sends(Tuple::new(a.ip(Family::V4), 40000, b.ip(Family::V4), 80).udp());
    let full_v6 = a.sends(Tuple::new(a.ip(Family::V6), 40000, b.ip(Family::V6), 80).udp());
    // An IP ethertype without a whole IP header cannot be judged: dropped.
    for (case, frame) in [
        ("IPv4, no header", &full_v4[..ETH_LEN]),
        (
            "IPv4, 19 bytes of header",
            &full_v4[..ETH_LEN + IPV4_LEN - 1],
        ),
        ("IPv6, no header", &full_v6[..ETH_LEN]),
        (
            "IPv6, 39 bytes of header",
            &full_v6[..ETH_LEN + IPV6_LEN - 1],
        ),
    ] {
        node.check(
            case,
            Hook::PodXdp(a),
            frame,
            XDP_DROP,
            frame,
            &[("dropped", 1)],
        );
    }
}

#[test]
fn xdp_replies_of_translated_flows_go_to_the_stack() {
    let Some(node) = node_or_skip(
        "xdp_replies_of_translated_flows_go_to_the_stack",
        DatapathMode::Xdp,
    ) else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    for family in FAMILIES {
        let request = Tuple::new(a.ip(family), 40000, CLUSTER_IP.of(family), SERVICE_PORT);
        let reply = Tuple::new(b.ip(family), BACKEND_PORT, a.ip(family), 40000);
        node.track("tcp", request, reply);
        let frame = b.sends(reply.tcp(TCP_SYN | TCP_ACK));
        node.check(
            &format!("{family:?} B's SYN-ACK"),
            Hook::PodXdp(b),
            &frame,
            XDP_PASS,
            &frame,
            &[("translated_to_stack", 1)],
        );
    }
}

// ---- NetworkPolicy -----------------------------------------------------------

/// TCP to `port` only.
fn tcp_port(port: u16) -> PolicyPortRange {
    PolicyPortRange {
        protocol: IPPROTO_TCP,
        first: port,
        last: port,
    }
}

fn udp_port(port: u16) -> PolicyPortRange {
    PolicyPortRange {
        protocol: IPPROTO_UDP,
        first: port,
        last: port,
    }
}

/// A rule for `cidr` allowing `ranges` (none: an explicit deny).
fn rule(cidr: &str, ranges: &[PolicyPortRange]) -> PolicyRule {
    PolicyRule {
        cidr: cidr.parse().expect("CIDR"),
        ports: PolicyPorts::Ranges(ranges.to_vec()),
    }
}

fn any_from(cidr: &str) -> PolicyRule {
    PolicyRule {
        cidr: cidr.parse().expect("CIDR"),
        ports: PolicyPorts::Any,
    }
}

impl Node {
    /// Isolates `pod` with these tables (in the node's namespace: the
    /// library attaches `to_pod` to the pod's host veth there).
    fn set_policy(&self, pod: &Pod, ingress: Option<&[PolicyRule]>, egress: Option<&[PolicyRule]>) {
        let datapath = &self.scratch.datapath;
        self.netns
            .run(|| datapath.set_pod_policy(pod.slot, ingress, egress))
            .expect("writing a pod's policy");
    }

    /// What policy dropped of `pod`: (ingress, egress) packets.
    fn policy_drops(&self, pod: &Pod) -> (u64, u64) {
        self.scratch
            .datapath
            .policy_drops(pod.slot)
            .expect("reading policy drops")
    }
}

#[test]
fn policy_leaves_pods_no_policy_selects_alone() {
    let Some(node) = node_or_skip(
        "policy_leaves_pods_no_policy_selects_alone",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    assert_eq!(
        node.scratch.datapath.slot_of(a.ip(Family::V4)).unwrap(),
        Some(a.slot)
    );
    assert_eq!(node.scratch.datapath.pod_policy(a.slot).unwrap().flags, 0);
    for family in FAMILIES {
        let flow = Tuple::new(a.ip(family), 40000, b.ip(family), 9999);
        let frame = a.sends(flow.udp());
        node.check(
            &format!("{family:?} unselected A to unselected B"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_REDIRECT,
            &b.receives(&frame),
            &[("redirected", 1)],
        );
        let from_host = b.sends(Tuple::new(THIS_NODE.of(family), 1, b.ip(family), 2).udp());
        node.check(
            &format!("{family:?} host to unselected B"),
            Hook::ToPod(b),
            &from_host,
            TC_NEXT,
            &from_host,
            &[],
        );
    }
    assert_eq!(node.policy_drops(a), (0, 0));
}

#[test]
fn policy_egress_allows_only_the_tables_ports_and_prefixes() {
    let Some(node) = node_or_skip(
        "policy_egress_allows_only_the_tables_ports_and_prefixes",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    // The pod subnet on TCP 8080 and UDP 53, except the unused address;
    // nothing else.
    let egress = [
        rule("10.244.0.0/16", &[tcp_port(8080), udp_port(53)]),
        rule("10.244.1.99/32", &[]),
        rule("fd00:244::/32", &[tcp_port(8080), udp_port(53)]),
        rule("fd00:244:1::99/128", &[]),
    ];
    node.set_policy(a, None, Some(&egress));
    assert_eq!(
        node.scratch.datapath.pod_policy(a.slot).unwrap().flags,
        POLICY_F_EGRESS
    );
    let mut denied = 0;
    for family in FAMILIES {
        let (ai, bi) = (a.ip(family), b.ip(family));
        let allowed = [
            ("TCP 8080", Tuple::new(ai, 40000, bi, 8080).tcp(TCP_SYN)),
            ("UDP 53", Tuple::new(ai, 40001, bi, 53).udp()),
        ];
        for (case, packet) in allowed {
            let frame = a.sends(packet);
            node.check(
                &format!("{family:?} {case} to B"),
                Hook::PodTc(a),
                &frame,
                TC_ACT_REDIRECT,
                &b.receives(&frame),
                &[("redirected", 1)],
            );
        }
        let dropped = [
            (
                "TCP 9090 to B",
                Tuple::new(ai, 40002, bi, 9090).tcp(TCP_SYN),
            ),
            ("UDP 8080 to B", Tuple::new(ai, 40003, bi, 8080).udp()),
            ("TCP 53 to B", Tuple::new(ai, 40004, bi, 53).tcp(TCP_SYN)),
            (
                "TCP 8080 to the except",
                Tuple::new(ai, 40005, UNUSED.of(family), 8080).tcp(TCP_SYN),
            ),
            (
                "TCP 8080 outside every prefix",
                Tuple::new(ai, 40006, OUTSIDE.of(family), 8080).tcp(TCP_SYN),
            ),
            (
                "TCP 8080 to the node",
                Tuple::new(ai, 40007, THIS_NODE.of(family), 8080).tcp(TCP_SYN),
            ),
            ("ICMP echo to B", ip_echo(ai, bi)),
        ];
        for (case, packet) in dropped {
            let frame = a.sends(packet);
            // Judged once the datapath has decided: a frame for B is
            // already rewritten for it.
            let left = if case.ends_with("to B") {
                b.receives(&frame)
            } else {
                frame.clone()
            };
            node.check(
                &format!("{family:?} {case}"),
                Hook::PodTc(a),
                &frame,
                TC_ACT_SHOT,
                &left,
                &[("policy_denied", 1)],
            );
            denied += 1;
        }
    }
    assert_eq!(
        node.policy_drops(a),
        (0, denied),
        "A's (ingress, egress) drops"
    );
    assert_eq!(node.policy_drops(b), (0, 0), "B's drops");
    // Not isolated any more: everything goes again, no entry is left.
    node.scratch.datapath.clear_pod_policy(a.slot).unwrap();
    assert!(
        node.scratch
            .datapath
            .pod_policy_rules(a.slot)
            .unwrap()
            .is_empty()
    );
    let frame = a.sends(Tuple::new(a.ip(Family::V4), 40002, b.ip(Family::V4), 9090).tcp(TCP_SYN));
    node.check(
        "TCP 9090 to B once the policy is gone",
        Hook::PodTc(a),
        &frame,
        TC_ACT_REDIRECT,
        &b.receives(&frame),
        &[("redirected", 1)],
    );
}

/// An ICMP echo request of the addresses' family, as an IP packet.
fn ip_echo(src: IpAddr, dst: IpAddr) -> (u16, Vec<u8>) {
    let (proto, message) = echo_request(src, dst);
    ip(src, dst, TTL, proto, &message)
}

#[test]
fn policy_ingress_of_a_local_destination_is_judged_before_the_redirect() {
    let Some(node) = node_or_skip(
        "policy_ingress_of_a_local_destination_is_judged_before_the_redirect",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    // B takes TCP 8080 from A only.
    let ingress = [
        rule(&format!("{}/32", POD_A.v4), &[tcp_port(8080)]),
        rule(&format!("{}/128", POD_A.v6), &[tcp_port(8080)]),
    ];
    node.set_policy(b, Some(&ingress), None);
    assert_eq!(
        node.scratch.datapath.pod_policy(b.slot).unwrap().flags,
        POLICY_F_INGRESS
    );
    for family in FAMILIES {
        let (ai, bi) = (a.ip(family), b.ip(family));
        let frame = a.sends(Tuple::new(ai, 40000, bi, 8080).tcp(TCP_SYN));
        node.check(
            &format!("{family:?} A to B on 8080"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_REDIRECT,
            &b.receives(&frame),
            &[("redirected", 1)],
        );
        let frame = a.sends(Tuple::new(ai, 40001, bi, 9090).tcp(TCP_SYN));
        // Rewritten for B before the judgement; dropped all the same.
        node.check(
            &format!("{family:?} A to B on 9090"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_SHOT,
            &b.receives(&frame),
            &[("policy_denied", 1)],
        );
        // From another node's pod, through the uplink: not in B's table.
        let frame = from_remote(REMOTE_POD.of(family), bi, TTL);
        let outcome = node.try_run(Hook::Uplink, &frame).unwrap();
        assert_eq!(outcome.verdict, TC_ACT_SHOT, "{family:?} remote pod to B");
    }
    assert_eq!(node.policy_drops(b), (4, 0), "B's (ingress, egress) drops");
    assert_eq!(node.policy_drops(a), (0, 0), "A's drops");
    let rules = node.scratch.datapath.pod_policy_rules(b.slot).unwrap();
    assert_eq!(rules.len(), 2, "{rules:?}");
}

#[test]
fn policy_replies_of_a_recorded_flow_pass_until_the_policy_changes() {
    let Some(node) = node_or_skip(
        "policy_replies_of_a_recorded_flow_pass_until_the_policy_changes",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    // A may open TCP 8080 to B and takes nothing in.
    let egress = [
        rule("10.244.0.0/16", &[tcp_port(8080)]),
        rule("fd00:244::/32", &[tcp_port(8080)]),
    ];
    node.set_policy(a, Some(&[]), Some(&egress));
    for family in FAMILIES {
        let flow = Tuple::new(a.ip(family), 40000, b.ip(family), 8080);
        let syn = a.sends(flow.tcp(TCP_SYN));
        node.check(
            &format!("{family:?} A opens 8080 on B"),
            Hook::PodTc(a),
            &syn,
            TC_ACT_REDIRECT,
            &b.receives(&syn),
            &[("redirected", 1)],
        );
        // B's answer has no entry in A's (empty) ingress table: it passes
        // as the reply of the flow A's egress recorded.
        let answer = b.sends(flow.reversed().tcp(TCP_SYN | TCP_ACK));
        node.check(
            &format!("{family:?} B answers"),
            Hook::PodTc(b),
            &answer,
            TC_ACT_REDIRECT,
            &a.receives(&answer),
            &[("redirected", 1)],
        );
        // The same through the stack (to_pod), e.g. after a ClusterIP.
        node.check(
            &format!("{family:?} B's answer through the stack"),
            Hook::ToPod(a),
            &answer,
            TC_NEXT,
            &answer,
            &[],
        );
        // A connection B opens to A is no reply.
        let other = b.sends(Tuple::new(b.ip(family), 40000, a.ip(family), 8080).tcp(TCP_SYN));
        node.check(
            &format!("{family:?} B opens 8080 on A"),
            Hook::PodTc(b),
            &other,
            TC_ACT_SHOT,
            &a.receives(&other),
            &[("policy_denied", 1)],
        );
    }
    assert_eq!(node.policy_drops(a), (2, 0));
    // A new policy that no longer allows 8080: the recorded flow is judged
    // again at its next packet, both ways, and cut.
    let egress = [
        rule("10.244.0.0/16", &[tcp_port(9090)]),
        rule("fd00:244::/32", &[tcp_port(9090)]),
    ];
    let before = node.scratch.datapath.pod_policy(a.slot).unwrap().generation;
    node.set_policy(a, Some(&[]), Some(&egress));
    assert_eq!(
        node.scratch.datapath.pod_policy(a.slot).unwrap().generation,
        before + 1
    );
    for family in FAMILIES {
        let flow = Tuple::new(a.ip(family), 40000, b.ip(family), 8080);
        let ack = a.sends(flow.tcp(TCP_ACK));
        node.check(
            &format!("{family:?} A's next packet after the change"),
            Hook::PodTc(a),
            &ack,
            TC_ACT_SHOT,
            &b.receives(&ack),
            &[("policy_denied", 1)],
        );
        let answer = b.sends(flow.reversed().tcp(TCP_ACK));
        node.check(
            &format!("{family:?} B's next answer after the change"),
            Hook::PodTc(b),
            &answer,
            TC_ACT_SHOT,
            &a.receives(&answer),
            &[("policy_denied", 1)],
        );
    }
    assert_eq!(node.policy_drops(a), (4, 2));
}

#[test]
fn policy_never_judges_link_scope_traffic() {
    let Some(node) = node_or_skip("policy_never_judges_link_scope_traffic", DatapathMode::Tc)
    else {
        return;
    };
    let a = &node.a;
    // Nothing in, nothing out.
    node.set_policy(a, Some(&[]), Some(&[]));
    let all_mld_routers: Ipv6Addr = "ff02::16".parse().expect("address");
    // An MLDv2 report as a pod's kernel sends it on joining a group: from
    // the unspecified address, behind a Hop-by-Hop header with the router
    // alert option (next header 0, so no transport header follows the
    // fixed one).
    let report = icmpv6(
        Ipv6Addr::UNSPECIFIED,
        all_mld_routers,
        143,
        0,
        &[0, 0, 0, 0],
    );
    let hop_by_hop = [IPPROTO_ICMPV6, 0, 5, 2, 0, 0, 1, 0];
    let frame = a.sends((
        ETH_P_IPV6,
        ipv6(
            Ipv6Addr::UNSPECIFIED,
            all_mld_routers,
            1,
            0,
            &[&hop_by_hop[..], &report].concat(),
        ),
    ));
    node.check(
        "MLDv2 report to ff02::16 behind a Hop-by-Hop header",
        Hook::PodTc(a),
        &frame,
        TC_NEXT,
        &frame,
        &[("passed_to_stack", 1)],
    );
    // UDP between link-local addresses (the pod and its host veth).
    let link_local_a: Ipv6Addr = "fe80::a".parse().expect("address");
    let link_local_host: Ipv6Addr = "fe80::1".parse().expect("address");
    let frame = a.sends(Tuple::new(link_local_a.into(), 546, link_local_host.into(), 547).udp());
    node.check(
        "UDP to a link-local address",
        Hook::PodTc(a),
        &frame,
        TC_NEXT,
        &frame,
        &[("passed_to_stack", 1)],
    );
    assert_eq!(node.policy_drops(a), (0, 0));
}

#[test]
fn policy_between_two_selected_pods_follows_either_pods_change() {
    let Some(node) = node_or_skip(
        "policy_between_two_selected_pods_follows_either_pods_change",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    let both_families = |port: u16| {
        [
            rule("10.244.0.0/16", &[tcp_port(port)]),
            rule("fd00:244::/32", &[tcp_port(port)]),
        ]
    };
    // A may open 8080 anywhere in the cluster, B takes 8080 in: both
    // judged on the redirect, then answered by one pair record.
    node.set_policy(a, None, Some(&both_families(8080)));
    node.set_policy(b, Some(&both_families(8080)), None);
    let segment =
        |family, flags| a.sends(Tuple::new(a.ip(family), 40050, b.ip(family), 8080).tcp(flags));
    for family in FAMILIES {
        for (case, flags) in [("SYN", TCP_SYN), ("ACK", TCP_ACK), ("next ACK", TCP_ACK)] {
            let frame = segment(family, flags);
            node.check(
                &format!("{family:?} A's {case} to B"),
                Hook::PodTc(a),
                &frame,
                TC_ACT_REDIRECT,
                &b.receives(&frame),
                &[("redirected", 1)],
            );
        }
    }
    // B's policy changes (no longer 8080): A's next packet is judged again
    // by B's new table and dropped, counted as B's ingress drop.
    node.set_policy(b, Some(&both_families(9090)), None);
    for family in FAMILIES {
        let frame = segment(family, TCP_ACK);
        node.check(
            &format!("{family:?} A's ACK after B's change"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_SHOT,
            &b.receives(&frame),
            &[("policy_denied", 1)],
        );
    }
    assert_eq!(node.policy_drops(b), (2, 0));
    // Back to 8080 for B, then A's policy changes: A's egress cuts it.
    node.set_policy(b, Some(&both_families(8080)), None);
    for family in FAMILIES {
        let frame = segment(family, TCP_ACK);
        node.check(
            &format!("{family:?} A's ACK with B allowing again"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_REDIRECT,
            &b.receives(&frame),
            &[("redirected", 1)],
        );
    }
    node.set_policy(a, None, Some(&both_families(9090)));
    for family in FAMILIES {
        let frame = segment(family, TCP_ACK);
        node.check(
            &format!("{family:?} A's ACK after A's change"),
            Hook::PodTc(a),
            &frame,
            TC_ACT_SHOT,
            &b.receives(&frame),
            &[("policy_denied", 1)],
        );
    }
    assert_eq!(node.policy_drops(a), (0, 2));
}

#[test]
fn policy_icmp_errors_of_a_recorded_flow_pass_as_part_of_it() {
    let Some(node) = node_or_skip(
        "policy_icmp_errors_of_a_recorded_flow_pass_as_part_of_it",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    // A may send UDP 8080 to B and takes nothing in.
    let egress = [
        rule("10.244.0.0/16", &[udp_port(8080)]),
        rule("fd00:244::/32", &[udp_port(8080)]),
    ];
    node.set_policy(a, Some(&[]), Some(&egress));
    for family in FAMILIES {
        let flow = Tuple::new(a.ip(family), 40040, b.ip(family), 8080);
        let (_, datagram) = flow.udp();
        let sent = a.sends(flow.udp());
        node.check(
            &format!("{family:?} A sends UDP 8080 to B"),
            Hook::PodTc(a),
            &sent,
            TC_ACT_REDIRECT,
            &b.receives(&sent),
            &[("redirected", 1)],
        );
        // B's port unreachable quotes A's datagram: part of A's flow, it
        // gets in though A's ingress table is empty; on the redirect and
        // through the stack alike.
        let about = |quoted: &[u8]| {
            let (proto, message) = port_unreachable(b.ip(family), a.ip(family), quoted);
            b.sends(ip(b.ip(family), a.ip(family), TTL, proto, &message))
        };
        let error = about(&datagram);
        node.check(
            &format!("{family:?} B's port unreachable"),
            Hook::PodTc(b),
            &error,
            TC_ACT_REDIRECT,
            &a.receives(&error),
            &[("redirected", 1)],
        );
        node.check(
            &format!("{family:?} B's port unreachable through the stack"),
            Hook::ToPod(a),
            &error,
            TC_NEXT,
            &error,
            &[],
        );
        // One quoting a datagram A never sent (another source port) is
        // ICMP like any other: denied.
        let (_, other) = Tuple::new(a.ip(family), 40041, b.ip(family), 8080).udp();
        let error = about(&other);
        node.check(
            &format!("{family:?} an error of no recorded flow"),
            Hook::PodTc(b),
            &error,
            TC_ACT_SHOT,
            &a.receives(&error),
            &[("policy_denied", 1)],
        );
    }
    assert_eq!(node.policy_drops(a), (2, 0));
}

#[test]
fn policy_to_pod_judges_what_the_stack_delivers_and_trusts_the_node() {
    let Some(node) = node_or_skip(
        "policy_to_pod_judges_what_the_stack_delivers_and_trusts_the_node",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let b = &node.b;
    let datapath = &node.scratch.datapath;
    datapath
        .set_local_addresses(&[THIS_NODE.v4.into(), THIS_NODE.v6.into()])
        .unwrap();
    // B takes anything from the remote pod, and nothing else; sends nothing.
    let ingress = [
        any_from(&format!("{}/32", REMOTE_POD.v4)),
        any_from(&format!("{}/128", REMOTE_POD.v6)),
    ];
    node.set_policy(b, Some(&ingress), Some(&[]));
    // to_pod went onto B's host veth egress, on a pinned tcx link.
    assert!(
        datapath
            .link_path(flatnet_datapath::bpf::LinkRole::ToPod, "host-b")
            .exists()
    );
    for family in FAMILIES {
        let bi = b.ip(family);
        let probe_flow = Tuple::new(THIS_NODE.of(family), 50000, bi, 8080);
        let probe = b.receives(&b.sends(probe_flow.tcp(TCP_SYN)));
        node.check(
            &format!("{family:?} a probe from the node"),
            Hook::ToPod(b),
            &probe,
            TC_NEXT,
            &probe,
            &[],
        );
        // B's answer to the node passes its (empty) egress table.
        let answer = b.sends(probe_flow.reversed().tcp(TCP_SYN | TCP_ACK));
        node.check(
            &format!("{family:?} B answers the probe"),
            Hook::PodTc(b),
            &answer,
            TC_NEXT,
            &answer,
            &[("passed_to_stack", 1)],
        );
        let remote = b.receives(&b.sends(Tuple::new(REMOTE_POD.of(family), 1, bi, 2).udp()));
        node.check(
            &format!("{family:?} the remote pod through the stack"),
            Hook::ToPod(b),
            &remote,
            TC_NEXT,
            &remote,
            &[],
        );
        let outside = b.receives(&b.sends(Tuple::new(OUTSIDE.of(family), 1, bi, 2).udp()));
        node.check(
            &format!("{family:?} the outside through the stack"),
            Hook::ToPod(b),
            &outside,
            TC_ACT_SHOT,
            &outside,
            &[("policy_denied", 1)],
        );
    }
    // Neighbour discovery is never judged.
    let ns = neighbour_solicitation(THIS_NODE.v6, POD_B.v6, Some(HOST_B_MAC));
    let frame = ethernet(POD_B_MAC, HOST_B_MAC, ETH_P_IPV6, &ns);
    node.check(
        "a neighbour solicitation",
        Hook::ToPod(b),
        &frame,
        TC_NEXT,
        &frame,
        &[],
    );
    assert_eq!(node.policy_drops(b), (2, 0));
    // Policy state goes with the pod (its slot may be reused).
    datapath.remove_pod(b.host_ifindex, None).unwrap();
    assert_eq!(datapath.pod_policy(b.slot).unwrap().flags, 0);
    assert!(datapath.pod_policy_rules(b.slot).unwrap().is_empty());
}

// ---- NetworkPolicy drop events (POLICY_EVENTS) -------------------------------

/// The events waiting in the node's `POLICY_EVENTS`.
fn policy_events(node: &Node) -> Vec<PolicyEvent> {
    node.scratch
        .datapath
        .policy_events()
        .expect("opening POLICY_EVENTS")
        .drain()
}

/// An address as events carry it (IPv4 in the first 4 bytes).
fn event_address(ip: IpAddr) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    match ip {
        IpAddr::V4(v4) => bytes[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => bytes = v6.octets(),
    }
    bytes
}

#[test]
fn policy_drops_are_reported_once_each_in_the_event_ring() {
    let Some(node) = node_or_skip(
        "policy_drops_are_reported_once_each_in_the_event_ring",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let (a, b) = (&node.a, &node.b);
    // A: egress to the pod subnet on TCP 8080, except the unused address.
    let egress = [
        rule("10.244.0.0/16", &[tcp_port(8080)]),
        rule("10.244.1.99/32", &[]),
        rule("fd00:244::/32", &[tcp_port(8080)]),
        rule("fd00:244:1::99/128", &[]),
    ];
    node.set_policy(a, None, Some(&egress));
    // B: ingress only from the unused address.
    let ingress = [
        any_from(&format!("{}/32", UNUSED.v4)),
        any_from(&format!("{}/128", UNUSED.v6)),
    ];
    node.set_policy(b, Some(&ingress), None);
    assert!(policy_events(&node).is_empty(), "events before any drop");
    let allowed_by_a_denied_by_b = 8080;
    for family in FAMILIES {
        let (ai, bi) = (a.ip(family), b.ip(family));
        let cases = [
            (
                "TCP 9090 to B",
                Tuple::new(ai, 40002, bi, 9090),
                a,
                POLICY_DIR_EGRESS,
                bi,
                POLICY_REASON_PORT,
            ),
            (
                "TCP 8080 to the except",
                Tuple::new(ai, 40003, UNUSED.of(family), 8080),
                a,
                POLICY_DIR_EGRESS,
                UNUSED.of(family),
                POLICY_REASON_EXCEPT,
            ),
            (
                "TCP 8080 outside every prefix",
                Tuple::new(ai, 40004, OUTSIDE.of(family), 8080),
                a,
                POLICY_DIR_EGRESS,
                OUTSIDE.of(family),
                POLICY_REASON_NO_PREFIX,
            ),
            (
                "TCP 8080 to B, not in B's ingress",
                Tuple::new(ai, 40005, bi, allowed_by_a_denied_by_b),
                b,
                POLICY_DIR_INGRESS,
                ai,
                POLICY_REASON_NO_PREFIX,
            ),
        ];
        for (case, flow, owner, direction, peer, reason) in cases {
            let frame = a.sends(flow.tcp(TCP_SYN));
            let outcome = node.try_run(Hook::PodTc(a), &frame).expect(case);
            assert_eq!(outcome.verdict, TC_ACT_SHOT, "{family:?} {case}: verdict");
            let events = policy_events(&node);
            assert_eq!(events.len(), 1, "{family:?} {case}: {events:?}");
            let event = events[0];
            assert_eq!(event.slot, owner.slot, "{family:?} {case}: slot");
            assert_eq!(
                u32::from(event.direction),
                direction,
                "{family:?} {case}: direction"
            );
            assert_eq!(event.reason, reason, "{family:?} {case}: reason");
            assert_eq!(event.protocol, IPPROTO_TCP, "{family:?} {case}");
            assert_eq!(
                event.family,
                if family == Family::V4 { 4 } else { 6 },
                "{family:?} {case}"
            );
            assert_eq!(event.src, event_address(flow.src), "{family:?} {case}: src");
            assert_eq!(event.dst, event_address(flow.dst), "{family:?} {case}: dst");
            let seen_peer = if direction == POLICY_DIR_INGRESS {
                event.src
            } else {
                event.dst
            };
            assert_eq!(seen_peer, event_address(peer), "{family:?} {case}: peer");
            assert_eq!(
                u16::from_be_bytes(event.sport),
                flow.sport,
                "{family:?} {case}"
            );
            assert_eq!(
                u16::from_be_bytes(event.dport),
                flow.dport,
                "{family:?} {case}"
            );
            assert_eq!(event.len as usize, frame.len(), "{family:?} {case}: len");
            assert!(event.timestamp_ns > 0, "{family:?} {case}: timestamp");
        }
        // Allowed both ways (A's egress to the except's neighbour on 8080
        // is not B's business): no event. A to B on 8080 with B open.
        node.scratch.datapath.clear_pod_policy(b.slot).unwrap();
        let frame = a.sends(Tuple::new(ai, 40006, bi, 8080).tcp(TCP_SYN));
        let outcome = node.try_run(Hook::PodTc(a), &frame).unwrap();
        assert_eq!(outcome.verdict, TC_ACT_REDIRECT, "{family:?} allowed");
        assert!(
            policy_events(&node).is_empty(),
            "{family:?}: an allowed packet made an event"
        );
        node.set_policy(b, Some(&ingress), None);
    }
    assert_eq!(node.stats()[action::POLICY_EVENTS_LOST as usize].packets, 0);
}

#[test]
fn policy_events_that_do_not_fit_are_counted_as_lost() {
    let Some(node) = node_or_skip(
        "policy_events_that_do_not_fit_are_counted_as_lost",
        DatapathMode::Tc,
    ) else {
        return;
    };
    let a = &node.a;
    node.set_policy(a, None, Some(&[]));
    let frame = a.sends(Tuple::new(a.ip(Family::V4), 40000, OUTSIDE.v4.into(), 80).tcp(TCP_SYN));
    // 64 bytes a record: the ring holds 4096 of them; nobody reads.
    let capacity = (POLICY_EVENTS_BYTES / 64) as u64;
    let runs = capacity + 100;
    let path = node.scratch.program_path(PROG_FROM_POD);
    node.netns.run(|| {
        for _ in 0..runs {
            let outcome = run_tc(&path, &frame, a.host_ifindex).expect("test run");
            assert_eq!(outcome.verdict, TC_ACT_SHOT);
        }
    });
    let stats = node.stats();
    assert_eq!(stats[action::POLICY_DENIED as usize].packets, runs);
    // The kernel keeps a little room free (4095 records fit here).
    let lost = stats[action::POLICY_EVENTS_LOST as usize].packets;
    let kept = policy_events(&node).len() as u64;
    assert_eq!(kept + lost, runs, "{kept} events kept, {lost} lost");
    assert!(
        (capacity - 8..=capacity).contains(&kept),
        "{kept} events kept"
    );
    // Read out, the ring takes events again.
    node.check(
        "a drop after the ring was read",
        Hook::PodTc(a),
        &frame,
        TC_ACT_SHOT,
        &frame,
        &[("policy_denied", 1)],
    );
    assert_eq!(policy_events(&node).len(), 1);
}
