//! The program of the node's VXLAN device: `from_tunnel` (tc ingress).
//! Its egress runs `to_uplink` (`entry::uplink`).

use aya_ebpf::bindings::TC_ACT_SHOT;
use aya_ebpf::macros::classifier;
use aya_ebpf::programs::TcContext;
use flatnet_common::action;

use crate::counters::count;
use crate::decision::TC_NEXT;
use crate::proto::PACKET_HOST;
use crate::tunnel::{self, TunnelSource};
use crate::uplink::{Arrival, deliver};

/// tc ingress of the node's VXLAN device: a decapsulated packet whose
/// inner source is a pod CIDR address of another node than the one that
/// sent it is dropped (whatever it is for); one from the sending node's
/// pod for a local pod goes straight into the pod; the rest is the host's.
#[classifier]
pub fn from_tunnel(ctx: TcContext) -> i32 {
    // SAFETY: the context pointer is valid for the program's run.
    if unsafe { (*ctx.skb.skb).pkt_type } != PACKET_HOST {
        return TC_NEXT;
    }
    match tunnel::source(&ctx) {
        TunnelSource::PeerPod => deliver(&ctx, Arrival::Tunnel, action::TUNNEL_TO_POD),
        TunnelSource::Refused => {
            count(action::TUNNEL_SOURCE_REFUSED, ctx.len());
            TC_ACT_SHOT as i32
        }
        TunnelSource::Other => TC_NEXT,
    }
}
