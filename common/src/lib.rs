//! Types shared by the eBPF datapath and the user-space plugin.
//!
//! Every map key and value is `#[repr(C)]`, `Copy`, has explicit padding and
//! no `bool`/enum/`Option` fields, so both sides agree on the layout byte for
//! byte and `bpftool map dump` can print the fields from BTF.
#![no_std]

use core::mem::size_of;

mod flows;
mod map_specs;
mod nat;
mod policy;
mod services;
mod tunnel;
pub use flows::*;
pub use map_specs::*;
pub use nat::*;
pub use policy::*;
pub use services::*;
pub use tunnel::*;

/// Maximum number of local pods per network (entries of `ENDPOINTS_V4`).
pub const MAX_ENDPOINTS: u32 = 16384;

/// Pin directory root; each network gets `<root>/<network>/`.
pub const PIN_ROOT: &str = "/sys/fs/bpf/flatnet";

/// Maps older builds pinned that this one no longer has (`TCP_FLOWS`:
/// `FLOWS` before it held UDP too), unpinned at load: the programs still
/// using them hold them open until their veths move over.
pub const RETIRED_MAPS: [&str; 1] = ["TCP_FLOWS"];
/// Claims held at once in `NAT_CLAIMS`: one per CPU running the NodePort
/// path, at most.
pub const NAT_CLAIMS_MAX: u32 = 1024;
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
/// tc classifier at ingress of host veths in XDP mode: what `from_pod_xdp`
/// passed to the stack, where a backend's reply of a flow the uplink
/// translated goes back to its client (tc helpers rewrite and route it).
pub const PROG_FROM_POD_PASSED: &str = "from_pod_passed";
/// XDP_PASS on the pod's interface: a veth accepts XDP-redirected frames
/// only with its NAPI on, which an attached XDP program turns on.
pub const PROG_POD_XDP_PASS: &str = "pod_xdp_pass";
/// tc classifier at the egress of host veths: what the host stack delivers
/// into a pod, judged against the pod's ingress policy; the flow it belongs
/// to loses a "clear" verdict in `FLOWS`.
pub const PROG_TO_POD: &str = "to_pod";
/// tc classifier on the node's uplink: traffic from other nodes for local
/// pods goes straight into them.
pub const PROG_FROM_UPLINK: &str = "from_uplink";
/// tc classifier at the ingress of the node's VXLAN device: decapsulated
/// packets from a tunnelled node's pods checked against the tunnel's outer
/// source and handed straight into local pods.
pub const PROG_FROM_TUNNEL: &str = "from_tunnel";
/// tc classifier at the egress of the node's uplink: what the host stack
/// sends to other nodes makes its flow lose a "clear" verdict in `FLOWS`
/// (the fast path's own packets, marked, pass untouched).
pub const PROG_TO_UPLINK: &str = "to_uplink";
/// tc classifier `from_pod` tail-calls (through `NODEPORT_CALLS`) for a
/// pod's packet it hands to the stack: a local backend's reply of a flow
/// the uplink translated goes back to the client. A program of its own so
/// that its stack is not added to `from_pod`'s.
pub const PROG_NODEPORT_REPLY: &str = "nodeport_reply";
/// tc classifier `from_uplink` tail-calls for a packet to a port a
/// frontend outside clients reach listens on (or a translated flow's node
/// port): translated to a backend, or a reply translated back.
pub const PROG_NODEPORT_IN: &str = "nodeport_in";
/// tc classifier `nodeport_in` tail-calls for a packet that was not the
/// NodePort path's after all: `from_uplink`'s own work.
pub const PROG_UPLINK_DELIVER: &str = "uplink_deliver";

/// Indices of `NODEPORT_CALLS`.
pub mod nodeport_call {
    pub const REPLY: u32 = 0;
    pub const IN: u32 = 1;
    pub const UPLINK_DELIVER: u32 = 2;
    /// The programs, by index.
    pub const PROGRAMS: [&str; 3] = [
        super::PROG_NODEPORT_REPLY,
        super::PROG_NODEPORT_IN,
        super::PROG_UPLINK_DELIVER,
    ];
}

/// `skb->mark` of a packet `from_pod` redirects to another node, from the
/// redirect to `to_uplink`, which clears it: no netfilter hook lies between
/// them (a redirect skips the stack), and a pod's packets arrive unmarked
/// (a veth clears the mark between namespaces). A whole value, not a bit:
/// the stack's own packets keep whatever marks others gave them.
pub const FAST_PATH_MARK: u32 = 0x666c_6e74;

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
/// The Service socket programs' load-time setting: the network namespace
/// cookie of the node's own processes (the loader's), a u64; 0 where no
/// loader set it.
pub const GLOBAL_NODE_NETNS_COOKIE: &str = "NODE_NETNS_COOKIE";
/// The datapath's load-time setting: whether UDP flows' conntrack answers
/// are kept in `FLOWS` (a u32, 1 where tcx puts `to_pod` and `to_uplink`
/// on every way out of the host stack, else 0).
pub const GLOBAL_UDP_FLOWS: &str = "UDP_FLOWS";

/// A measurement's load-time setting (a u32, `cost_variant`): 0 in every
/// load flatnet makes, so the verifier prunes the cut-down paths from the
/// programs it runs (a known constant's untaken branch is dead code; the
/// constant's load at each check site stays: keep the sites few).
pub const GLOBAL_COST_VARIANT: &str = "COST_VARIANT";

/// `from_pod` cut down, to measure where a packet's nanoseconds go
/// (`cargo xtask bench`'s breakdown, `flatnet-cost-variant`): the whole
/// program against the same program without one of its parts.
pub mod cost_variant {
    /// The program as deployed.
    pub const FULL: u32 = 0;
    /// Returns at once: what BPF statistics charge any program.
    pub const RETURN: u32 = 1;
    /// Ethernet and IPv4 headers, the destination's `ENDPOINTS_V4` entry,
    /// its MACs and `bpf_redirect_peer`: the least a fast path that looks
    /// the destination up in a map can do.
    pub const REDIRECT_ONLY: u32 = 2;
    /// Without the flow's verdict (`FLOWS`, conntrack): every TCP and UDP
    /// packet is clear.
    pub const NO_FLOW: u32 = 3;
    /// Without NetworkPolicy.
    pub const NO_POLICY: u32 = 4;
    /// Without the `STATS` and per-pod counters.
    pub const NO_COUNTERS: u32 = 5;

    /// Each variant's name, as the measurement's table shows it.
    pub const NAMES: [(u32, &str); 6] = [
        (FULL, "full"),
        (RETURN, "return"),
        (REDIRECT_ONLY, "redirect-only"),
        (NO_FLOW, "no-flow"),
        (NO_POLICY, "no-policy"),
        (NO_COUNTERS, "no-counters"),
    ];

    /// The variant called `name`.
    pub fn named(name: &str) -> Option<u32> {
        NAMES.iter().find(|(_, n)| *n == name).map(|(v, _)| *v)
    }
}

/// Maximum number of other nodes' pod CIDRs per family.
pub const MAX_REMOTE_CIDRS: u32 = 16384;
/// Maximum number of other nodes' addresses per family (`PEER_NODES_*`).
pub const MAX_PEER_NODES: u32 = 16384;

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

/// The node that owns a remote pod CIDR. Routed directly, the datapath only
/// needs to know that the CIDR is another node's (it asks the kernel's FIB
/// for the way there); tunnelled (`REMOTE_F_TUNNEL`), the node's address
/// is the tunnel's far end and the only outer source its pods' packets may
/// arrive from.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RemoteNode {
    /// The node's address (IPv4 in the first 4 bytes), network byte order.
    pub node_address: [u8; 16],
    /// `AF_INET` (2) or `AF_INET6` (10): the family of `node_address`.
    pub family: u32,
    /// `REMOTE_F_*` bits.
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

/// A packet and byte counter; one per action in the per-CPU `STATS` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Counter {
    pub packets: u64,
    pub bytes: u64,
}
const _: () = assert!(size_of::<Counter>() == 16);

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
    /// A pod's packet for a tunnelled node's pod CIDR, encapsulated by the
    /// datapath (tunnel key set, sent into the VXLAN device).
    pub const TO_TUNNEL: u32 = 13;
    /// A packet that arrived through the tunnel, handed from the VXLAN
    /// device straight into a local pod with `bpf_redirect_peer`.
    pub const TUNNEL_TO_POD: u32 = 14;
    /// Dropped at the VXLAN device: an inner source in a pod CIDR that is
    /// not the sending node's (another node's, or a local pod's address).
    pub const TUNNEL_SOURCE_REFUSED: u32 = 15;
    /// A packet from outside for a NodePort or external address,
    /// translated to a backend on this node and handed into it.
    pub const NODEPORT_TO_POD: u32 = 16;
    /// The same, to a backend on another node: sent out of the uplink with
    /// the node's address as its source.
    pub const NODEPORT_TO_NODE: u32 = 17;
    /// A backend's reply of such a flow, translated back and sent out to
    /// the client.
    pub const NODEPORT_REPLIED: u32 = 18;
    /// Dropped: `externalTrafficPolicy: Local` and no backend on this
    /// node, or no free node port for the source translation.
    pub const NODEPORT_DROPPED: u32 = 19;
    /// A TCP packet from another node's address (`PEER_NODES_*`: a
    /// NodePort flow that node sent on, a host-network client), handed from
    /// the uplink straight into a local pod.
    pub const PEER_NODE_TO_POD: u32 = 20;
    /// A pod's reply in such a flow, sent out of the uplink to that node by
    /// the datapath.
    pub const TO_PEER_NODE: u32 = 21;
    /// Number of actions: the size of `STATS`.
    pub const COUNT: u32 = 22;

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
        "to_tunnel",
        "tunnel_to_pod",
        "tunnel_source_refused",
        "nodeport_to_pod",
        "nodeport_to_node",
        "nodeport_replied",
        "nodeport_dropped",
        "peer_node_to_pod",
        "to_peer_node",
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
    unsafe impl aya::Pod for super::TunnelConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::FlowKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::FlowVerdict {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PolicyPod {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PolicyCidrV4 {}
    // SAFETY: #[repr(C)], three u32s, no padding.
    unsafe impl aya::Pod for super::PolicyPeerKey {}
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
    // SAFETY: as above.
    unsafe impl aya::Pod for super::NodePortAddress {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::NatKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::NatForward {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::NatReverse {}
}
