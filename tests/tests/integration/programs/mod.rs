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
    Counter, Endpoint, PROG_FROM_POD, PROG_FROM_POD_XDP, PROG_FROM_UPLINK, PROG_TO_POD,
    SOURCES_F_MORE, action,
};
use flatnet_datapath::bpf::PolicyPortRange;
use flatnet_datapath::bpf::{RemoteCidr, Shaping};
use flatnet_tests::frames::*;
use flatnet_tests::test_run::{
    Outcome, ScratchDatapath, TC_ACT_REDIRECT, TC_ACT_SHOT, TC_NEXT, XDP_DROP, XDP_PASS,
    XDP_REDIRECT, XDP_TX, run_tc, run_xdp,
};
use flatnet_tests::{Netns, flatnet_test};

mod conntrack;
mod cost;
mod cross_node;
mod flows;
mod local;
mod neighbours;
mod policy;
mod variants;
mod xdp;

// Helpers of one section used by another.
#[allow(unused_imports)]
use {conntrack::*, cross_node::*, local::*, neighbours::*, policy::*, xdp::*};

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
        let remote: Vec<RemoteCidr> = REMOTE_CIDRS
            .iter()
            .map(|(cidr, node)| RemoteCidr {
                cidr: cidr.parse().expect("CIDR"),
                node: *node,
                tunnelled: false,
            })
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
    /// The routes the agent writes via the other nodes (`REMOTE_CIDRS`),
    /// forwarding on in the node's namespace, and `REMOTE_NODE`'s MAC known
    /// (`UNRESOLVED_NODE`'s not).
    fn route_remote_cidrs(&self) {
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
        self.exec_lines(&setup);
    }

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
