//! Types shared by the eBPF datapath and the user-space plugin.
//!
//! Every map key and value is `#[repr(C)]`, `Copy`, has explicit padding and
//! no `bool`/enum/`Option` fields, so both sides agree on the layout byte for
//! byte and `bpftool map dump` can print the fields from BTF.
#![no_std]

use core::mem::size_of;

/// Maximum number of local pods per network (entries of `ENDPOINTS_V4`).
pub const MAX_ENDPOINTS: u32 = 16384;

/// Pin directory root; each network gets `<root>/<network>/`.
pub const PIN_ROOT: &str = "/sys/fs/bpf/flatnet";

/// Map and program names, as they appear in the object file and on bpffs.
pub const MAP_ENDPOINTS_V4: &str = "ENDPOINTS_V4";
pub const MAP_ENDPOINTS_V6: &str = "ENDPOINTS_V6";
pub const MAP_HOST_VETHS: &str = "HOST_VETHS";
pub const MAP_STATS: &str = "STATS";
pub const MAP_ENDPOINT_STATS: &str = "ENDPOINT_STATS";
/// Each pod's own addresses, by counter slot: the source check.
pub const MAP_POD_SOURCES: &str = "POD_SOURCES";
/// What conntrack said of each TCP flow the fast path saw (an LRU cache).
pub const MAP_TCP_FLOWS: &str = "TCP_FLOWS";
/// NetworkPolicy: each pod's isolation by counter slot, its allowed
/// prefixes (LPM tries), the flows already judged, its drops, and the
/// node's own addresses (always allowed in).
pub const MAP_POLICY_PODS: &str = "POLICY_PODS";
pub const MAP_POLICY_V4: &str = "POLICY_V4";
pub const MAP_POLICY_V6: &str = "POLICY_V6";
pub const MAP_POLICY_FLOWS: &str = "POLICY_FLOWS";
pub const MAP_POLICY_DROPS: &str = "POLICY_DROPS";
pub const MAP_LOCAL_ADDRS: &str = "LOCAL_ADDRS";
/// NetworkPolicy drops, one `PolicyEvent` each (a ring buffer `flatnet
/// monitor` reads).
pub const MAP_POLICY_EVENTS: &str = "POLICY_EVENTS";
/// Services at the socket (`--services ebpf`): frontends, their backends,
/// and which ClusterIP each connected or sending socket's peer stands for.
pub const MAP_SERVICES: &str = "SERVICES";
pub const MAP_SERVICE_BACKENDS: &str = "SERVICE_BACKENDS";
pub const MAP_SERVICE_REVNAT: &str = "SERVICE_REVNAT";
/// sessionAffinity ClientIP: the backend each client (network namespace)
/// was given for a frontend, and when it last used it.
pub const MAP_SERVICE_AFFINITY: &str = "SERVICE_AFFINITY";
/// Other nodes' pod CIDRs (LPM tries), filled by the node agent.
pub const MAP_REMOTE_CIDRS_V4: &str = "REMOTE_CIDRS_V4";
pub const MAP_REMOTE_CIDRS_V6: &str = "REMOTE_CIDRS_V6";
/// Every map's name, in the order of `MAP_SPECS` (the order they are pinned).
pub const MAPS: [&str; MAP_SPECS.len()] = {
    let mut names = [""; MAP_SPECS.len()];
    let mut i = 0;
    while i < MAP_SPECS.len() {
        names[i] = MAP_SPECS[i].name;
        i += 1;
    }
    names
};
/// tc classifier on host veths (`"datapath": "tc"`).
pub const PROG_FROM_POD: &str = "from_pod";
/// XDP program on host veths (`"datapath": "xdp"`).
pub const PROG_FROM_POD_XDP: &str = "from_pod_xdp";
/// XDP_PASS on the pod's interface: a veth accepts XDP-redirected frames
/// only with its NAPI on, which an attached XDP program turns on.
pub const PROG_POD_XDP_PASS: &str = "pod_xdp_pass";
/// tc classifier at the egress of host veths: what the host stack delivers
/// into a pod, judged against the pod's ingress policy.
pub const PROG_TO_POD: &str = "to_pod";
/// tc classifier on the node's uplink: traffic from other nodes for local
/// pods goes straight into them.
pub const PROG_FROM_UPLINK: &str = "from_uplink";

/// cgroup v2 socket programs of Services in eBPF: connect() and sendmsg()
/// to a ClusterIP choose a backend and rewrite the destination; recvmsg()
/// and getpeername() show the ClusterIP back.
pub const PROG_SERVICE_CONNECT4: &str = "service_connect4";
pub const PROG_SERVICE_CONNECT6: &str = "service_connect6";
pub const PROG_SERVICE_SENDMSG4: &str = "service_sendmsg4";
pub const PROG_SERVICE_SENDMSG6: &str = "service_sendmsg6";
pub const PROG_SERVICE_RECVMSG4: &str = "service_recvmsg4";
pub const PROG_SERVICE_RECVMSG6: &str = "service_recvmsg6";
pub const PROG_SERVICE_GETPEERNAME4: &str = "service_getpeername4";
pub const PROG_SERVICE_GETPEERNAME6: &str = "service_getpeername6";

/// The datapath's load-time setting: whether `from_uplink` hands packets
/// from other nodes' pods straight to local pods (a u32, 1 or 0).
pub const GLOBAL_UPLINK_TO_PODS: &str = "UPLINK_TO_PODS";

/// Maximum number of other nodes' pod CIDRs per family.
pub const MAX_REMOTE_CIDRS: u32 = 16384;

/// IPv4 address in network byte order, as it appears in the packet.
pub type Ipv4Key = [u8; 4];
/// IPv6 address in network byte order.
pub type Ipv6Key = [u8; 16];

/// One local pod, as the datapath needs it to deliver a packet to it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Endpoint {
    /// Interface index of the pod's host-side veth (redirect target).
    pub host_ifindex: u32,
    /// `ENDPOINT_F_*` bits.
    pub flags: u32,
    /// MAC of the pod's interface inside its network namespace.
    pub pod_mac: [u8; 6],
    /// MAC of the host-side veth: the pod's only neighbour.
    pub host_mac: [u8; 6],
    /// The pod's index into `ENDPOINT_STATS` and `POD_SOURCES`
    /// (`NO_COUNTER_SLOT`: none).
    pub counter_slot: u32,
}
const _: () = assert!(size_of::<Endpoint>() == 24);

/// `counter_slot` of a pod without per-pod counters (an older build's entry).
pub const NO_COUNTER_SLOT: u32 = 0;

/// The counter slot ADD tries first for the pod behind host veth `ifindex`
/// (and takes, unless another pod has it): the datapath computes it from
/// the frame's ingress ifindex, so it finds the sender's slot without a
/// lookup in most cases (`PodSources::host_ifindex` says whether it guessed
/// right; else it looks the veth up in `HOST_VETHS`).
pub const fn preferred_slot(ifindex: u32) -> u32 {
    1 + ifindex % (MAX_ENDPOINTS - 1)
}

/// No flag set.
pub const ENDPOINT_F_NONE: u32 = 0;
/// Traffic into the pod is shaped by a qdisc on its host veth's egress (the
/// bandwidth plugin's `ingressRate`): frames for it take the host stack,
/// which delivers them through that qdisc, never the redirect past it.
pub const ENDPOINT_F_SHAPED_INGRESS: u32 = 1;

/// Key data of `REMOTE_CIDRS_V4`: the network address of the CIDR, in
/// network byte order (the LPM key adds the prefix length in front).
pub type RemoteCidrV4 = [u8; 4];
pub type RemoteCidrV6 = [u8; 16];

/// The node that owns a remote pod CIDR. The datapath only needs to know
/// that the CIDR is another node's (it asks the kernel's FIB for the way
/// there); the node's address is kept for people reading the map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RemoteNode {
    /// The node's address (IPv4 in the first 4 bytes), network byte order.
    pub node_address: [u8; 16],
    /// `AF_INET` (2) or `AF_INET6` (10): the family of `node_address`.
    pub family: u32,
    /// No flags defined yet.
    pub flags: u32,
}
const _: () = assert!(size_of::<RemoteNode>() == 24);
// LPM trie values sit right after the key data: 4-byte alignment at most.
const _: () = assert!(core::mem::align_of::<RemoteNode>() <= 4);

/// What a pod sent and what the datapath delivered to it: the per-CPU
/// array `ENDPOINT_STATS`, indexed by the pod's `counter_slot` (an array,
/// not a hash: its lookups cost next to nothing per packet).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EndpointCounters {
    /// Packets the pod sent (seen on its host veth).
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Packets the datapath redirected into the pod.
    pub rx_packets: u64,
    pub rx_bytes: u64,
}
const _: () = assert!(size_of::<EndpointCounters>() == 32);

/// Addresses per family that `PodSources` holds; a pod with more has
/// `SOURCES_F_MORE` set and the rest are checked in `ENDPOINTS_V4/V6`.
pub const SOURCES_PER_FAMILY: usize = 4;

/// The addresses a pod may send from, in the array `POD_SOURCES` by its
/// counter slot: the datapath drops a pod's packet from any other source.
/// An array, not a lookup of the source in `ENDPOINTS_V4/V6`: the sender's
/// slot is known without a lookup (`preferred_slot`), and an array read costs
/// next to nothing (a hash lookup cost ~35 ns per packet here).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PodSources {
    /// IPv4 addresses, network byte order; unused ones 0.0.0.0.
    pub v4: [[u8; 4]; SOURCES_PER_FAMILY],
    /// IPv6 addresses; unused ones `::`.
    pub v6: [[u8; 16]; SOURCES_PER_FAMILY],
    /// `SOURCES_F_*` bits.
    pub flags: u32,
    /// The pod's host veth: whose slot this is. The datapath finds a
    /// sender's slot from its ifindex (`preferred_slot`) and checks here
    /// that the slot is that veth's.
    pub host_ifindex: u32,
}
const _: () = assert!(size_of::<PodSources>() == 88);

/// The entry is written (an all-zero one is a slot no ADD filled: an
/// older build's pod, checked in `ENDPOINTS_V4/V6` instead).
pub const SOURCES_F_VALID: u32 = 1;
/// The pod has more addresses than the entry holds.
pub const SOURCES_F_MORE: u32 = 2;
/// Traffic from the pod is shaped at its host veth's ingress (the bandwidth
/// plugin's `egressRate`: an `ingress` qdisc redirecting to an ifb device),
/// which runs after the tcx programs: the datapath hands the pod's frames
/// to it (`TC_ACT_UNSPEC`) instead of redirecting them past it.
pub const SOURCES_F_SHAPED_EGRESS: u32 = 4;

/// Entries of `TCP_FLOWS`: an LRU, so a busy node forgets old flows (a
/// forgotten flow's next packet asks conntrack again: slower, never wrong).
pub const MAX_TCP_FLOWS: u32 = 65536;

/// One direction of a TCP flow: the packet's own addresses and ports
/// (IPv4 in the first 4 bytes of each address), network byte order.
/// Aligned to 8 so that building one takes word stores, not a `memset`.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FlowKey {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: [u8; 2],
    pub dport: [u8; 2],
    /// 4 or 6.
    pub family: u32,
}
const _: () = assert!(size_of::<FlowKey>() == 40);

/// What the kernel's conntrack said of a flow when its last SYN (or its
/// first packet the fast path saw) passed: `verdict::*`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FlowVerdict {
    pub verdict: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<FlowVerdict>() == 8);

/// Values of `FlowVerdict::verdict`.
pub mod verdict {
    /// The host never saw the flow: the fast path takes it.
    pub const CLEAR: u32 = 0;
    /// The host tracks the flow: the stack takes it.
    pub const TRACKED: u32 = 1;
    /// The host translated the flow: the stack takes it and undoes that.
    pub const TRANSLATED: u32 = 2;
}

/// A packet and byte counter; one per action in the per-CPU `STATS` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Counter {
    pub packets: u64,
    pub bytes: u64,
}
const _: () = assert!(size_of::<Counter>() == 16);

// ---- NetworkPolicy ---------------------------------------------------------

/// The entry of a pod in `POLICY_PODS` (an array by counter slot): which of
/// its directions a policy isolates (`POLICY_F_*`; 0: selected by no
/// policy, the only lookup such a pod's packets pay) and the generation of
/// its policy, which the flows recorded in `POLICY_FLOWS` carry: a flow of
/// an older generation is judged again (see `PolicyFlow`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyPod {
    pub flags: u32,
    pub generation: u32,
}
const _: () = assert!(size_of::<PolicyPod>() == 8);

/// Traffic into the pod is only what its ingress table allows.
pub const POLICY_F_INGRESS: u32 = 1;
/// Traffic from the pod is only what its egress table allows.
pub const POLICY_F_EGRESS: u32 = 2;

/// `direction` of policy keys: traffic into the pod, from the pod.
pub const POLICY_DIR_INGRESS: u32 = 0;
pub const POLICY_DIR_EGRESS: u32 = 1;
/// A `POLICY_FLOWS` record of both judgements of a pod-to-pod packet on
/// one node: the sender's egress (`slot`, the `generation`) and the local
/// receiver's ingress (`receiver_slot`, its generation in `flags`), so the
/// redirect path checks one record instead of two.
pub const POLICY_DIR_PAIR: u32 = 2;

/// The most port ranges one policy entry holds (the agent's
/// `MAX_PORT_RANGES`).
pub const POLICY_MAX_RANGES: usize = 16;

/// Entries per family of `POLICY_V4`/`POLICY_V6`, all pods together
/// (allocated as used: LPM tries are never preallocated).
pub const MAX_POLICY_ENTRIES: u32 = 65536;

/// Key data of `POLICY_V4`: the pod's counter slot and the direction, both
/// always matched in full (the prefix length counts their 64 bits), then
/// the peer's address, matched up to the entry's prefix.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyCidrV4 {
    pub slot: u32,
    pub direction: u32,
    pub address: [u8; 4],
}
const _: () = assert!(size_of::<PolicyCidrV4>() == 12);

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyCidrV6 {
    pub slot: u32,
    pub direction: u32,
    pub address: [u8; 16],
}
const _: () = assert!(size_of::<PolicyCidrV6>() == 24);

/// Bits of an LPM key's prefix before the address: slot and direction.
pub const POLICY_KEY_FIXED_BITS: u32 = 64;

/// Ports `first..=last` (host byte order) of IP protocol `protocol`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyRange {
    pub protocol: u8,
    pub _pad: u8,
    pub first: u16,
    pub last: u16,
}
const _: () = assert!(size_of::<PolicyRange>() == 6);

/// What a policy entry allows to or from its prefix: everything (`any` 1:
/// every protocol, ICMP included), or the first `count` of `ranges`
/// (count 0: nothing, an explicit deny, e.g. an ipBlock's `except`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyPorts {
    pub any: u8,
    pub count: u8,
    pub _pad: [u8; 2],
    pub ranges: [PolicyRange; POLICY_MAX_RANGES],
}
const _: () = assert!(size_of::<PolicyPorts>() == 100);
const _: () = assert!(core::mem::align_of::<PolicyPorts>() <= 4);

/// Entries of `POLICY_FLOWS` (an LRU: an idle flow is forgotten, and its
/// next packet is judged again).
pub const MAX_POLICY_FLOWS: u32 = 65536;

/// A flow allowed by a pod's policy in one direction: the packet's own
/// addresses (IPv4 in the first 4 bytes), ports (network byte order; 0 for
/// protocols without), protocol, family (4 or 6), and whose judgement it
/// is (`slot`, `direction`: `POLICY_DIR_*`; `receiver_slot` only for
/// `POLICY_DIR_PAIR`, else 0).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyFlowKey {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: [u8; 2],
    pub dport: [u8; 2],
    pub protocol: u8,
    pub family: u8,
    pub direction: u8,
    pub _pad: u8,
    pub slot: u32,
    pub receiver_slot: u32,
}
const _: () = assert!(size_of::<PolicyFlowKey>() == 48);

/// The policy generation (`PolicyPod::generation`) a flow was allowed
/// under, and `POLICY_FLOW_F_REPLY` when the entry was written for the
/// replies of a flow allowed in the other direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyFlow {
    pub generation: u32,
    pub flags: u32,
}
const _: () = assert!(size_of::<PolicyFlow>() == 8);

/// The entry allows the replies of a flow the other direction allowed.
pub const POLICY_FLOW_F_REPLY: u32 = 1;

/// What policy dropped of a pod's traffic, per CPU, by counter slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyDrops {
    pub ingress_packets: u64,
    pub ingress_bytes: u64,
    pub egress_packets: u64,
    pub egress_bytes: u64,
}
const _: () = assert!(size_of::<PolicyDrops>() == 32);

/// Bytes of the `POLICY_EVENTS` ring buffer (a power of two, a multiple
/// of the page size): 4096 events of 56 bytes and their 8-byte headers.
pub const POLICY_EVENTS_BYTES: u32 = 256 * 1024;

/// One packet NetworkPolicy dropped, as `POLICY_EVENTS` carries it: when
/// (`bpf_ktime_get_ns`, CLOCK_MONOTONIC), whose (`slot`: the pod's counter
/// slot; `direction`: `POLICY_DIR_*`), the packet's own addresses (IPv4 in
/// the first 4 bytes; the peer is `src` for ingress, `dst` for egress),
/// ports (network byte order; 0 for protocols without), protocol, family (4
/// or 6), its length, and why (`POLICY_REASON_*`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PolicyEvent {
    pub timestamp_ns: u64,
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: [u8; 2],
    pub dport: [u8; 2],
    pub protocol: u8,
    pub family: u8,
    pub direction: u8,
    pub reason: u8,
    pub slot: u32,
    pub len: u32,
}
const _: () = assert!(size_of::<PolicyEvent>() == 56);

/// Why policy dropped a packet: no entry's prefix holds the peer.
pub const POLICY_REASON_NO_PREFIX: u8 = 1;
/// The longest prefix holding the peer does not allow the protocol and port.
pub const POLICY_REASON_PORT: u8 = 2;
/// The longest prefix holding the peer is an explicit deny (an ipBlock's
/// `except`).
pub const POLICY_REASON_EXCEPT: u8 = 3;

/// Service ports (frontends) and backends a node holds, and sockets whose
/// peer stands for a ClusterIP.
pub const MAX_SERVICES: u32 = 65536;
pub const MAX_SERVICE_BACKENDS: u32 = 262144;
pub const MAX_SERVICE_REVNAT: u32 = 65536;
pub const MAX_SERVICE_AFFINITY: u32 = 65536;

/// A client of a frontend with sessionAffinity: its network namespace
/// (a pod's, or the host's: one client IP each) and the frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AffinityKey {
    pub netns_cookie: u64,
    pub frontend: ServiceKey,
    pub _pad: u32,
}
const _: () = assert!(size_of::<AffinityKey>() == 32);

/// The backend (`index` in set `id`) a client was given, and when it last
/// connected to the frontend (monotonic ns). Worth nothing once the
/// frontend moved to another backend set.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Affinity {
    pub id: u32,
    pub index: u32,
    pub last_ns: u64,
}

/// A Service frontend: a ClusterIP (IPv4 in the first 4 bytes), a port
/// (network order) and protocol.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ServiceKey {
    pub address: [u8; 16],
    pub port: [u8; 2],
    pub protocol: u8,
    /// 4 or 6.
    pub family: u8,
}
const _: () = assert!(size_of::<ServiceKey>() == 20);

/// Where a frontend's backends are: `count` of them in
/// `SERVICE_BACKENDS` under (`id`, 0..count). `count` 0: the Service has no
/// endpoint, connect() is refused. `affinity_secs`: sessionAffinity
/// ClientIP's timeout (0: none).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ServiceValue {
    pub id: u32,
    pub count: u32,
    pub affinity_secs: u32,
    pub _pad: u32,
}

/// Backend `index` of the backend set `id`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BackendKey {
    pub id: u32,
    pub index: u32,
}

/// A backend: an address (IPv4 in the first 4 bytes) and port (network
/// order).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ServiceBackend {
    pub address: [u8; 16],
    pub port: [u8; 2],
    pub family: u8,
    pub _pad: u8,
}
const _: () = assert!(size_of::<ServiceBackend>() == 20);

/// A socket (its cookie) whose peer is `address`:`port` because a
/// ClusterIP was rewritten to it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RevNatKey {
    pub cookie: u64,
    pub address: [u8; 16],
    pub port: [u8; 2],
    pub family: u8,
    pub _pad: [u8; 5],
}
const _: () = assert!(size_of::<RevNatKey>() == 32);

/// The ClusterIP and port the application asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RevNat {
    pub address: [u8; 16],
    pub port: [u8; 2],
    pub _pad: [u8; 2],
}
const _: () = assert!(size_of::<RevNat>() == 20);

/// Entries of `LOCAL_ADDRS`: the node's own addresses.
pub const MAX_LOCAL_ADDRS: u32 = 256;

/// A node address in `LOCAL_ADDRS`: IPv6, or IPv4 mapped (`::ffff:a.b.c.d`).
pub type LocalAddrKey = [u8; 16];

/// Indices into `STATS`: what the datapath did with a packet.
pub mod action {
    /// Handed straight to a local pod with `bpf_redirect_peer`.
    pub const REDIRECTED: u32 = 0;
    /// Returned to the host stack (pod to host, pod to outside, unknown).
    pub const PASSED: u32 = 1;
    /// An ARP request from a pod answered by the datapath itself.
    pub const ARP_ANSWERED: u32 = 2;
    /// Dropped by the datapath itself: a pod's packet whose source address
    /// is not one of the pod's, or whose IP header is too short to read.
    pub const DROPPED: u32 = 3;
    /// An IPv6 neighbour solicitation from a pod answered by the datapath.
    pub const ND_ANSWERED: u32 = 4;
    /// A pod's packet for another node's pod CIDR, sent out of the uplink
    /// by the datapath (`bpf_fib_lookup` + `bpf_redirect_neigh`).
    pub const TO_REMOTE_NODE: u32 = 5;
    /// A pod's packet for another node's pod CIDR that the datapath could
    /// not route itself (no route, TTL 1, too big, XDP mode): host stack.
    pub const REMOTE_PASSED: u32 = 6;
    /// A packet from another node, handed from the uplink straight into a
    /// local pod with `bpf_redirect_peer`.
    pub const FROM_UPLINK: u32 = 7;
    /// A packet for a pod (local or on another node) of a flow the host's
    /// netfilter translated (a Service's DNAT, a hostPort, masquerade):
    /// handed to the host stack, which undoes the translation, instead of
    /// taking the fast path.
    pub const TRANSLATED: u32 = 8;
    /// A packet for a pod of a flow the host's conntrack tracks without a
    /// translation (its first packet went through the stack: to a node
    /// address, say): handed to the stack, so that conntrack sees every
    /// packet of the flow and keeps its state right.
    pub const TRACKED: u32 = 9;
    /// A packet that would have taken the fast path, handed to the host
    /// stack because the bandwidth plugin shapes its sender's egress or its
    /// receiver's ingress there (see `ENDPOINT_F_SHAPED_INGRESS`).
    pub const SHAPED: u32 = 10;
    /// Dropped by NetworkPolicy (the sender's egress or the receiver's
    /// ingress; per pod and direction in `POLICY_DROPS`).
    pub const POLICY_DENIED: u32 = 11;
    /// A policy drop whose event did not fit in `POLICY_EVENTS` (no reader,
    /// or one too slow): the drop itself is counted as `POLICY_DENIED`.
    pub const POLICY_EVENTS_LOST: u32 = 12;
    /// Number of actions: the size of `STATS`.
    pub const COUNT: u32 = 13;

    /// Names in index order, for reports.
    pub const NAMES: [&str; COUNT as usize] = [
        "redirected",
        "passed_to_stack",
        "arp_answered",
        "dropped",
        "nd_answered",
        "to_remote_node",
        "remote_passed_to_stack",
        "uplink_to_pod",
        "translated_to_stack",
        "tracked_to_stack",
        "shaped_to_stack",
        "policy_denied",
        "policy_events_lost",
    ];
}

/// Kernel functions the datapath calls, and the placeholder each call
/// carries in the object until the loader writes the function's BTF id in
/// the running kernel there (see the eBPF crate's kfunc.rs).
pub mod kfunc {
    /// `bpf_skb_ct_lookup`: the conntrack entry of a tuple, from tc.
    pub const KFUNC_SKB_CT_LOOKUP: u32 = 0x6b66_6e01;
    /// `bpf_xdp_ct_lookup`: the same from XDP.
    pub const KFUNC_XDP_CT_LOOKUP: u32 = 0x6b66_6e02;
    /// `bpf_ct_release`: drops the reference a lookup returned.
    pub const KFUNC_CT_RELEASE: u32 = 0x6b66_6e03;
    /// (placeholder, kernel function name) for each.
    pub const PLACEHOLDERS: [(u32, &str); 3] = [
        (KFUNC_SKB_CT_LOOKUP, "bpf_skb_ct_lookup"),
        (KFUNC_XDP_CT_LOOKUP, "bpf_xdp_ct_lookup"),
        (KFUNC_CT_RELEASE, "bpf_ct_release"),
    ];
    /// The first four bytes of a kfunc call instruction: `BPF_JMP | BPF_CALL`,
    /// source register `BPF_PSEUDO_KFUNC_CALL`, offset 0 (vmlinux BTF).
    pub const CALL_PREFIX: [u8; 4] = [0x85, 0x20, 0x00, 0x00];
}

/// The kind of a BPF map (`BPF_MAP_TYPE_*`), as the loader checks a pinned
/// map against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapKind {
    Hash,
    LruHash,
    Array,
    PerCpuArray,
    LpmTrie,
    /// A ring buffer: no key or value, `max_entries` is its size in bytes.
    RingBuf,
}

/// One map of the datapath: what the eBPF side declares (its statics take
/// `max_entries` from here and assert their key and value types against
/// it) and what the loader expects of a pinned map before it reuses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSpec {
    pub name: &'static str,
    pub kind: MapKind,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
}

impl MapSpec {
    /// True when `K` and `V` are this map's key and value (by size: the
    /// eBPF side's compile-time check).
    pub const fn holds<K, V>(&self) -> bool {
        self.key_size as usize == size_of::<K>() && self.value_size as usize == size_of::<V>()
    }

    const fn new<K, V>(name: &'static str, kind: MapKind, max_entries: u32) -> Self {
        MapSpec {
            name,
            kind,
            key_size: size_of::<K>() as u32,
            value_size: size_of::<V>() as u32,
            max_entries,
        }
    }
}

/// The key of an LPM trie: a prefix length, then the address.
#[repr(C)]
pub struct LpmKey<T> {
    pub prefix_len: u32,
    pub data: T,
}

/// The datapath's maps, one spec each (see `MapSpec`).
pub mod maps {
    use super::*;

    pub const ENDPOINTS_V4: MapSpec =
        MapSpec::new::<Ipv4Key, Endpoint>(MAP_ENDPOINTS_V4, MapKind::Hash, MAX_ENDPOINTS);
    pub const ENDPOINTS_V6: MapSpec =
        MapSpec::new::<Ipv6Key, Endpoint>(MAP_ENDPOINTS_V6, MapKind::Hash, MAX_ENDPOINTS);
    pub const HOST_VETHS: MapSpec =
        MapSpec::new::<u32, Endpoint>(MAP_HOST_VETHS, MapKind::Hash, MAX_ENDPOINTS);
    pub const STATS: MapSpec =
        MapSpec::new::<u32, Counter>(MAP_STATS, MapKind::PerCpuArray, action::COUNT);
    pub const ENDPOINT_STATS: MapSpec = MapSpec::new::<u32, EndpointCounters>(
        MAP_ENDPOINT_STATS,
        MapKind::PerCpuArray,
        MAX_ENDPOINTS,
    );
    pub const POD_SOURCES: MapSpec =
        MapSpec::new::<u32, PodSources>(MAP_POD_SOURCES, MapKind::Array, MAX_ENDPOINTS);
    pub const TCP_FLOWS: MapSpec =
        MapSpec::new::<FlowKey, FlowVerdict>(MAP_TCP_FLOWS, MapKind::LruHash, MAX_TCP_FLOWS);
    pub const REMOTE_CIDRS_V4: MapSpec = MapSpec::new::<LpmKey<RemoteCidrV4>, RemoteNode>(
        MAP_REMOTE_CIDRS_V4,
        MapKind::LpmTrie,
        MAX_REMOTE_CIDRS,
    );
    pub const REMOTE_CIDRS_V6: MapSpec = MapSpec::new::<LpmKey<RemoteCidrV6>, RemoteNode>(
        MAP_REMOTE_CIDRS_V6,
        MapKind::LpmTrie,
        MAX_REMOTE_CIDRS,
    );
    pub const POLICY_PODS: MapSpec =
        MapSpec::new::<u32, PolicyPod>(MAP_POLICY_PODS, MapKind::Array, MAX_ENDPOINTS);
    pub const POLICY_V4: MapSpec = MapSpec::new::<LpmKey<PolicyCidrV4>, PolicyPorts>(
        MAP_POLICY_V4,
        MapKind::LpmTrie,
        MAX_POLICY_ENTRIES,
    );
    pub const POLICY_V6: MapSpec = MapSpec::new::<LpmKey<PolicyCidrV6>, PolicyPorts>(
        MAP_POLICY_V6,
        MapKind::LpmTrie,
        MAX_POLICY_ENTRIES,
    );
    pub const POLICY_FLOWS: MapSpec = MapSpec::new::<PolicyFlowKey, PolicyFlow>(
        MAP_POLICY_FLOWS,
        MapKind::LruHash,
        MAX_POLICY_FLOWS,
    );
    pub const POLICY_DROPS: MapSpec =
        MapSpec::new::<u32, PolicyDrops>(MAP_POLICY_DROPS, MapKind::PerCpuArray, MAX_ENDPOINTS);
    pub const LOCAL_ADDRS: MapSpec =
        MapSpec::new::<LocalAddrKey, u32>(MAP_LOCAL_ADDRS, MapKind::Hash, MAX_LOCAL_ADDRS);
    pub const POLICY_EVENTS: MapSpec =
        MapSpec::new::<(), ()>(MAP_POLICY_EVENTS, MapKind::RingBuf, POLICY_EVENTS_BYTES);
    pub const SERVICES: MapSpec =
        MapSpec::new::<ServiceKey, ServiceValue>(MAP_SERVICES, MapKind::Hash, MAX_SERVICES);
    pub const SERVICE_BACKENDS: MapSpec = MapSpec::new::<BackendKey, ServiceBackend>(
        MAP_SERVICE_BACKENDS,
        MapKind::Hash,
        MAX_SERVICE_BACKENDS,
    );
    pub const SERVICE_REVNAT: MapSpec =
        MapSpec::new::<RevNatKey, RevNat>(MAP_SERVICE_REVNAT, MapKind::LruHash, MAX_SERVICE_REVNAT);
    pub const SERVICE_AFFINITY: MapSpec = MapSpec::new::<AffinityKey, Affinity>(
        MAP_SERVICE_AFFINITY,
        MapKind::LruHash,
        MAX_SERVICE_AFFINITY,
    );
}

/// Every map, in the order they are pinned.
pub const MAP_SPECS: [MapSpec; 20] = [
    maps::ENDPOINTS_V4,
    maps::ENDPOINTS_V6,
    maps::HOST_VETHS,
    maps::STATS,
    maps::ENDPOINT_STATS,
    maps::POD_SOURCES,
    maps::TCP_FLOWS,
    maps::REMOTE_CIDRS_V4,
    maps::REMOTE_CIDRS_V6,
    maps::POLICY_PODS,
    maps::POLICY_V4,
    maps::POLICY_V6,
    maps::POLICY_FLOWS,
    maps::POLICY_DROPS,
    maps::LOCAL_ADDRS,
    maps::POLICY_EVENTS,
    maps::SERVICES,
    maps::SERVICE_BACKENDS,
    maps::SERVICE_REVNAT,
    maps::SERVICE_AFFINITY,
];

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain `#[repr(C)]` data with explicit padding, valid for any bit pattern.
    unsafe impl aya::Pod for super::Endpoint {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Counter {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::EndpointCounters {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RemoteNode {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PodSources {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::FlowKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::FlowVerdict {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PolicyPod {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PolicyCidrV4 {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PolicyCidrV6 {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PolicyPorts {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PolicyFlowKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PolicyFlow {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PolicyDrops {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PolicyEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ServiceKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ServiceValue {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::BackendKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ServiceBackend {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RevNatKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RevNat {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::AffinityKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Affinity {}
}
