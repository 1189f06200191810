//! The NodePort path's maps (see `nodeport`): which ports listen
//! (`EXTERNAL_PORTS`), its programs (`NODEPORT_CALLS`), its flows both
//! ways (`NAT_FORWARD`, `NAT_REVERSE`), fragments' ports, local sources,
//! port claims, and its per-CPU scratch area with the types it holds.

use aya_ebpf::bindings::bpf_fib_lookup;
use aya_ebpf::btf_maps::PerCpuArray;
use aya_ebpf::macros::btf_map;
use flatnet_common::{FragmentKey, FragmentKey6, NatForward, NatKey, NatReverse, ServiceBackend};

use super::map;

map!(
    /// Which protocols' frontends listen on each port (`external_port` bits).
    EXTERNAL_PORTS
);

map!(
    /// The NodePort path's programs, for `from_pod` and `from_uplink` to
    /// tail-call (`nodeport_call` indices).
    NODEPORT_CALLS
);

map!(
    /// Translated flows by the client's tuple.
    NAT_FORWARD
);

map!(
    /// Translated flows by their replies' tuple.
    NAT_REVERSE
);

map!(
    /// The ports of fragmented datagrams, from their first fragments, for
    /// their later ones.
    NAT_FRAGMENTS
);

map!(
    /// The same for IPv6 datagrams (their fragment header's identification).
    NAT_FRAGMENTS6
);

map!(
    /// The source address the kernel picks on the way to a local pod, per
    /// family (index 0 IPv4, 1 IPv6), as the last new flow to a local backend
    /// found it.
    NAT_LOCAL_SOURCES
);

map!(
    /// Node ports being taken from spent flows (`take_claimed`).
    NAT_CLAIMS
);

/// What the path works on for the packet at hand, per CPU (a program runs
/// to its end on one CPU).
#[repr(C)]
pub(crate) struct Scratch {
    /// The packet's flow.
    pub(crate) key: NatKey,
    /// A new flow's reply tuple.
    pub(crate) reply: NatKey,
    pub(crate) forward: NatForward,
    pub(crate) reverse: NatReverse,
    /// The flow that holds a node port a new flow wants, and its key.
    pub(crate) spent: NatReverse,
    pub(crate) spent_key: NatKey,
    /// Where the packet's transport header starts (an ICMP error's: the
    /// quoted packet's).
    pub(crate) l4: u32,
    /// Where an ICMP error's header starts; 0: the packet is no ICMP error.
    pub(crate) icmp: u32,
    /// Where the quoted packet's transport checksum is, when the error
    /// quotes it and it is in use; 0: not patched.
    pub(crate) quoted_l4_csum: u32,
    /// The quoted packet's IPv4 header and transport checksums before the
    /// error is rewritten.
    pub(crate) quoted_csums: [u16; 2],
    /// What an ICMP error's rewrite makes of it.
    pub(crate) error: ErrorRewrite,
    /// A fragmented datagram's fragment (`FRAGMENT_*`), and its datagram
    /// (by the key of its family).
    pub(crate) fragment: u32,
    pub(crate) fragment_key: FragmentKey,
    pub(crate) fragment_key6: FragmentKey6,
    /// The `NAT_F_*` flags the packet sets: `NAT_F_CLOSING` for a TCP FIN,
    /// with `NAT_F_RESET` for a RST.
    pub(crate) closing: u32,
    /// 1: the packet opens a TCP connection (a SYN without ACK). On a flow
    /// whose connection is over, its client reused the port (`reopens`).
    pub(crate) opening: u32,
    /// The source a translated flow's packets to its backend are given
    /// (`nat_source`).
    pub(crate) nat_source: [u8; 16],
    /// A FIB lookup's question and answer (`local_masquerade_source`).
    pub(crate) fib: bpf_fib_lookup,
    /// A new flow's backend.
    pub(crate) backend: ServiceBackend,
}

/// What an error's rewrite makes of it, for either way it goes.
#[repr(C)]
pub(crate) struct ErrorRewrite {
    /// What the quoted packet's source and destination become.
    pub(crate) quoted_source: [u8; 16],
    pub(crate) quoted_destination: [u8; 16],
    pub(crate) quoted_source_port: [u8; 2],
    pub(crate) quoted_destination_port: [u8; 2],
    pub(crate) _pad: u32,
    /// Where the error goes.
    pub(crate) to: [u8; 16],
    /// The error's sender, when it is the flow's other end (the quoted
    /// packet's destination), becomes this.
    pub(crate) other_end: [u8; 16],
    pub(crate) other_end_becomes: [u8; 16],
}

/// `Scratch::fragment`: a whole datagram; the first fragment of one (its
/// ports are kept for the rest); a later one (no transport header: its
/// ports are the first's).
pub(crate) const FRAGMENT_NONE: u32 = 0;
pub(crate) const FRAGMENT_FIRST: u32 = 1;
pub(crate) const FRAGMENT_LATER: u32 = 2;

#[btf_map]
pub(crate) static NODEPORT_SCRATCH: PerCpuArray<Scratch, 1> = PerCpuArray::new();
