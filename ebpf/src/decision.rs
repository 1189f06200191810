//! What the pod veth's programs do with a frame (`Decision`), and what a
//! tc program returns to hand it on to the host stack (`TC_NEXT`).

use aya_ebpf::bindings::TC_ACT_UNSPEC;

/// What to do with a frame; MACs are already rewritten when it leaves.
pub(crate) enum Decision {
    /// To the host stack.
    Pass,
    /// To the host stack, which translated the flow and must undo it.
    Translated,
    /// To the host stack, which tracks the flow.
    Tracked,
    /// Dropped: a source address the pod does not own, or an IP header too
    /// short to tell.
    Drop,
    /// Into the pod behind host veth `host_ifindex`; `slot`: its counters.
    ToPod { host_ifindex: u32, slot: u32 },
    /// Back out of the veth it came from (a neighbour answer).
    Bounce,
    /// To another node's pod: routed by the caller, or passed to the stack.
    Remote,
    /// To another node's own address, of a TCP flow the host never saw
    /// (one that node opened, `from_uplink` took past the stack): a
    /// reply of the NodePort path's flow goes back that way
    /// (`nodeport_reply`), the rest is routed like `Remote`.
    PeerNode,
    /// To a pod of a node reached through the VXLAN tunnel: encapsulated by
    /// the caller, or passed to the stack (which routes it into the tunnel).
    Tunnel,
    /// To another node's pod, of a kind only the stack may judge.
    RemoteToStack,
    /// A local backend's reply of a flow the NodePort path translated
    /// keeping its client's address (its flow's kept verdict): translated
    /// back and sent on by `nodeport_reply`; the stack's if that flow has
    /// gone.
    NodePortReply,
    /// To the host stack, where a qdisc shapes the sender's or the
    /// receiver's traffic (the bandwidth plugin).
    Shaped,
    /// Dropped by NetworkPolicy: the sender's egress or the local
    /// receiver's ingress (counted per pod in `POLICY_DROPS`).
    Denied,
}

/// What a tc program returns to hand a frame on to the host stack: "next"
/// (`TCX_NEXT`, `TC_ACT_UNSPEC`), not "pass" (`TCX_PASS`, `TC_ACT_OK`), so
/// that what else sits on the hook after flatnet still runs: later tcx
/// programs, and the legacy qdisc's filters (the bandwidth plugin's
/// `ingress` qdisc, which shapes a pod's egress), which tcx runs only after
/// a "next" from the last program.
pub(crate) const TC_NEXT: i32 = TC_ACT_UNSPEC;
