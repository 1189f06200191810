//! flatnet datapath: programs on the host side of every pod veth, and one on
//! the node's uplink.
//!
//! Both attachment modes run the same decision on every frame a pod sends:
//! answer its ARP requests and IPv6 neighbour solicitations itself (so pods
//! never need a bridge to find neighbours), hand IPv4/IPv6 packets for
//! another local pod straight to that pod, and return everything else to
//! the host stack. `from_pod` (tc ingress) delivers with `bpf_redirect_peer`;
//! `from_pod_xdp` (XDP) with `bpf_redirect` into the destination's host veth,
//! whose peer runs `pod_xdp_pass` so that it accepts XDP frames.
//!
//! Cross-node: a packet for another node's pod CIDR (the `REMOTE_CIDRS_*`
//! tries the node agent fills) leaves `from_pod` through the kernel's own
//! route to that node (`bpf_fib_lookup`, then `bpf_redirect`, or
//! `bpf_redirect_neigh` while the next hop's MAC is unknown), or goes to
//! the host stack when the FIB has no usable answer. `from_uplink`, on the
//! node's uplink, hands packets from other nodes for a local pod straight
//! into it with `bpf_redirect_peer`.
//!
//! Layout, as Cilium's bpf/: one file per attach point under `entry/`
//! (pod veth, uplink, tunnel, socket), each program a few lines over the
//! features' logic (`pod`, `uplink`, `tunnel`, `remote`, `flow`, `policy`,
//! `nodeport/`, `services`, ...); below them all the maps (`maps/`), the
//! protocol numbers and address classes (`proto`) and packet access
//! (`packet`), which import nothing of the features.
#![no_std]
#![no_main]
// Kfunc calls are written as raw instructions (see kfunc.rs).
#![feature(asm_experimental_arch)]

// The programs, one file per attach point.
mod entry;

// The features' logic.
mod counters;
mod decision;
mod external_ports;
mod flow;
mod kfunc;
mod nat_table;
mod neighbours;
mod nodeport;
mod pod;
mod policy;
mod remote;
mod send;
mod sender;
mod services;
mod tunnel;
mod uplink;
mod variant;

// Below the logic: the maps, protocol numbers and packet access.
mod maps;
mod packet;
mod proto;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
