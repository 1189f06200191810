//! `FLOWS`: what the fast path keeps of the kernel's conntrack answers,
//! one entry per flow direction.

/// Entries of `FLOWS`: an LRU, so a busy node forgets old flows (a
/// forgotten flow's next packet asks conntrack again: slower, never wrong).
pub const MAX_FLOWS: u32 = 65536;

/// One direction of a TCP or UDP flow: the packet's own addresses and
/// ports (IPv4 in the first 4 bytes of each address), network byte order.
/// Aligned to 8 so that building one takes word stores, not a `memset`.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FlowKey {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: [u8; 2],
    pub dport: [u8; 2],
    /// 4 or 6.
    pub family: u8,
    /// IPPROTO_TCP or IPPROTO_UDP.
    pub proto: u8,
    pub _pad: [u8; 2],
}
const _: () = assert!(size_of::<FlowKey>() == 40);

/// What the kernel's conntrack said of a flow direction when the fast path
/// last asked (a TCP flow's SYNs; a flow's first packet the fast path saw,
/// or its first since the host stack carried one of its packets):
/// `verdict::*`.
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
    /// The replies of a flow flatnet's NodePort path translated keeping
    /// the client's address (`externalTrafficPolicy: Local`, hostPorts):
    /// `nodeport_reply` translates them back. Written by that path when
    /// the flow starts, not by a conntrack lookup.
    pub const NODEPORT_REPLY: u32 = 3;
}
