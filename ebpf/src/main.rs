//! flatnet datapath: the tc classifier on the host side of every pod veth.
//!
//! `from_pod` sees every packet a pod sends. It answers the pod's ARP
//! requests itself (so pods never need a bridge to find neighbours), hands
//! IPv4 packets for another local pod straight to that pod with
//! `bpf_redirect_peer`, and returns everything else to the host stack.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    btf_maps::{HashMap, PerCpuArray},
    helpers::generated::{bpf_redirect, bpf_redirect_peer},
    macros::{btf_map, classifier},
    programs::TcContext,
};
use core::mem::size_of;
use flatnet_common::{Counter, Endpoint, Ipv4Key, MAX_ENDPOINTS, action};
use network_types::{arp::ArpHdr, eth::EthHdr, ip::Ipv4Hdr};

/// Local pods by IPv4 address.
#[btf_map]
static ENDPOINTS_V4: HashMap<Ipv4Key, Endpoint, { MAX_ENDPOINTS as usize }> = HashMap::new();

/// Per-CPU packet/byte counters, indexed by `flatnet_common::action`.
#[btf_map]
static STATS: PerCpuArray<Counter, { action::COUNT as usize }> = PerCpuArray::new();

const ETH_P_IP: u16 = 0x0800;
const ETH_P_ARP: u16 = 0x0806;
const ARPHRD_ETHER: u16 = 1;
const ARPOP_REQUEST: u16 = 1;
const ARPOP_REPLY: u16 = 2;

#[classifier]
pub fn from_pod(ctx: TcContext) -> i32 {
    match try_from_pod(&ctx) {
        Ok(verdict) => verdict,
        // A frame too short for the header it announces: let the stack judge it.
        Err(()) => pass(&ctx),
    }
}

#[inline(always)]
fn try_from_pod(ctx: &TcContext) -> Result<i32, ()> {
    let eth: *mut EthHdr = header_at(ctx, 0)?;
    // SAFETY: `header_at` checked the header lies inside the packet.
    match u16::from_be(unsafe { (*eth).ether_type }) {
        ETH_P_IP => ipv4(ctx, eth),
        ETH_P_ARP => arp(ctx, eth),
        _ => Ok(pass(ctx)),
    }
}

#[inline(always)]
fn ipv4(ctx: &TcContext, eth: *mut EthHdr) -> Result<i32, ()> {
    let ip: *const Ipv4Hdr = header_at(ctx, EthHdr::LEN)?;
    // SAFETY: bounds checked by `header_at`.
    let dst: Ipv4Key = unsafe { (*ip).dst_addr };
    // SAFETY: the reference is read at once, before any map update can reuse the slot.
    let Some(peer) = (unsafe { ENDPOINTS_V4.get(dst) }).copied() else {
        return Ok(pass(ctx));
    };
    if peer.host_ifindex == ifindex(ctx) {
        // Addressed to the sending pod itself: nothing to shortcut.
        return Ok(pass(ctx));
    }
    // The receiving pod must see a frame addressed to it, coming from its own
    // host veth (its only neighbour), exactly as if the host had routed it.
    // SAFETY: bounds checked by `header_at`; tc programs may write packet data.
    unsafe {
        (*eth).dst_addr = peer.pod_mac;
        (*eth).src_addr = peer.host_mac;
    }
    // SAFETY: plain helper call; a bad ifindex makes the kernel drop the packet.
    let verdict = unsafe { bpf_redirect_peer(peer.host_ifindex, 0) } as i32;
    if verdict == TC_ACT_SHOT as i32 {
        count(ctx, action::DROPPED);
    } else {
        count(ctx, action::REDIRECTED);
    }
    Ok(verdict)
}

/// Answers an ARP request from the pod with the MAC of its host veth, so the
/// pod sends everything (other pods, gateway, outside) to this program.
#[inline(always)]
fn arp(ctx: &TcContext, eth: *mut EthHdr) -> Result<i32, ()> {
    let arp: *mut ArpHdr = header_at(ctx, EthHdr::LEN)?;
    // SAFETY: bounds checked by `header_at`.
    let req = unsafe { &mut *arp };
    if u16::from_be_bytes(req.htype) != ARPHRD_ETHER
        || u16::from_be_bytes(req.ptype) != ETH_P_IP
        || req.hlen != 6
        || req.plen != 4
        || u16::from_be_bytes(req.oper) != ARPOP_REQUEST
    {
        return Ok(pass(ctx));
    }
    let (sender_ip, target_ip) = (req.spa, req.tpa);
    // Probes (sender 0.0.0.0) and announcements of the pod's own address must
    // stay unanswered, or the pod would believe its address is taken.
    if sender_ip == [0; 4] || sender_ip == target_ip {
        return Ok(pass(ctx));
    }
    // The sender's own entry tells which host veth it sits behind; a pod that
    // claims another pod's address gets no answer.
    // SAFETY: read at once, see `ipv4`.
    let Some(me) = (unsafe { ENDPOINTS_V4.get(sender_ip) }).copied() else {
        return Ok(pass(ctx));
    };
    let here = ifindex(ctx);
    if me.host_ifindex != here {
        return Ok(pass(ctx));
    }
    let pod_mac = req.sha;
    req.oper = ARPOP_REPLY.to_be_bytes();
    req.tha = pod_mac;
    req.tpa = sender_ip;
    req.sha = me.host_mac;
    req.spa = target_ip;
    // SAFETY: bounds checked by `header_at`.
    unsafe {
        (*eth).dst_addr = pod_mac;
        (*eth).src_addr = me.host_mac;
    }
    count(ctx, action::ARP_ANSWERED);
    // Egress of the same host veth: the reply goes straight back to the pod.
    // SAFETY: plain helper call.
    Ok(unsafe { bpf_redirect(here, 0) } as i32)
}

#[inline(always)]
fn pass(ctx: &TcContext) -> i32 {
    count(ctx, action::PASSED);
    TC_ACT_OK as i32
}

#[inline(always)]
fn count(ctx: &TcContext, what: u32) {
    if let Some(counter) = STATS.get_ptr_mut(what) {
        // SAFETY: per-CPU slot: no other writer while this program runs here.
        unsafe {
            (*counter).packets += 1;
            (*counter).bytes += u64::from(ctx.len());
        }
    }
}

#[inline(always)]
fn ifindex(ctx: &TcContext) -> u32 {
    // SAFETY: the context pointer is valid for the program's run.
    unsafe { (*ctx.skb.skb).ifindex }
}

/// A pointer to a `T` at `offset` into the packet, if the packet is long enough.
#[inline(always)]
fn header_at<T>(ctx: &TcContext, offset: usize) -> Result<*mut T, ()> {
    let start = ctx.data();
    if start + offset + size_of::<T>() > ctx.data_end() {
        return Err(());
    }
    Ok((start + offset) as *mut T)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
