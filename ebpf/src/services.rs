//! Services at the socket: cgroup v2 programs that every process in the
//! cgroup they are attached to (the node's root cgroup: pods and host
//! alike) runs on connect(), sendmsg(), recvmsg() and getpeername().
//!
//! connect() and sendmsg() to a frontend in `SERVICES` (a ClusterIP, port
//! and protocol) pick one of its backends at random and rewrite the
//! destination before the kernel routes anything: the first packet already
//! goes to the backend pod's address, so the fast path, NetworkPolicy and
//! the counters see real pod addresses, and no NAT is left to undo. The
//! socket's cookie and its backend are recorded in `SERVICE_REVNAT`, so
//! recvmsg() (a UDP reply's source) and getpeername() show the ClusterIP
//! the application asked for: a resolver that checks where its answer came
//! from is satisfied. A frontend without backends refuses connect() with
//! ECONNREFUSED, as kube-proxy's REJECT does, and sendmsg() with EPERM.
//!
//! A NodePort's frontend has the unspecified address of its family: a
//! destination that is no frontend but one of `NODEPORT_ADDRS` (every
//! node's addresses) is looked up again as that wildcard, so a NodePort
//! costs one entry whatever the number of nodes. A call to a destination
//! that is no frontend reads its port's `EXTERNAL_PORTS` entry (an array
//! read) and looks `NODEPORT_ADDRS` up only on a port a NodePort of the
//! protocol has.
//!
//! sessionAffinity ClientIP: a client is a network namespace (a pod, one
//! address; or the host), keyed by its cookie in `SERVICE_AFFINITY` with
//! the backend it was given; it keeps that backend while it connects again
//! within the timeout and the frontend keeps its backend set (a new set
//! starts afresh).
//!
//! The programs themselves are in `entry::socket`; the maps in
//! `maps::services`.

use aya_ebpf::EbpfContext;
use aya_ebpf::bindings::{bpf_sock_addr, sockaddr};
use aya_ebpf::helpers::generated::{
    bpf_bind, bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_get_socket_cookie, bpf_ktime_get_ns,
    bpf_set_retval,
};
use aya_ebpf::programs::SockAddrContext;
use flatnet_common::{
    Affinity, AffinityKey, BackendKey, FRONTEND_F_KEEP_CLIENT, NODEPORT_ADDR_OTHER_NODE,
    NodePortAddress, RevNat, RevNatKey, ServiceKey, ServiceValue,
};

use crate::maps::endpoints::{ENDPOINTS_V4, ENDPOINTS_V6};
use crate::maps::services::{
    NODE_NETNS_COOKIE, NODE_SOURCES, NODEPORT_ADDRS, SERVICE_AFFINITY, SERVICE_BACKENDS,
    SERVICE_REVNAT, SERVICES,
};
use crate::policy;
use crate::proto::{AF_INET, AF_INET6};

/// What a cgroup sock_addr program answers: let the call go on (with
/// whatever address it now holds), or fail it.
const PROCEED: i32 = 1;
const REFUSE: i32 = 0;
const ECONNREFUSED: i32 = 111;

/// The destination (or, for recvmsg and getpeername, the peer) of the call:
/// address (IPv4 in the first 4 bytes), port (network order).
struct Peer {
    address: [u8; 16],
    port: [u8; 2],
}

#[inline(always)]
fn read_peer(addr: *const bpf_sock_addr, family: u8) -> Peer {
    let mut address = [0u8; 16];
    // SAFETY: fields of the context the kernel passed, read as whole u32s
    // (the verifier allows only such loads of user_ip6).
    unsafe {
        if family == 4 {
            address[..4]
                .copy_from_slice(&core::ptr::read_volatile(&(*addr).user_ip4).to_ne_bytes());
        } else {
            for i in 0..4 {
                let word = core::ptr::read_volatile(&(*addr).user_ip6[i]).to_ne_bytes();
                address[i * 4..i * 4 + 4].copy_from_slice(&word);
            }
        }
        let port = core::ptr::read_volatile(&(*addr).user_port) as u16;
        Peer {
            address,
            port: port.to_ne_bytes(),
        }
    }
}

#[inline(always)]
fn write_peer(addr: *mut bpf_sock_addr, family: u8, address: &[u8; 16], port: [u8; 2]) {
    // SAFETY: writable fields of the context for these attach points.
    unsafe {
        write_address(
            &mut (*addr).user_ip4,
            &mut (*addr).user_ip6,
            family,
            address,
        );
        core::ptr::write_volatile(&mut (*addr).user_port, u32::from(u16::from_ne_bytes(port)));
    }
}

/// `address` into a context's IPv4 or IPv6 address field, whole u32s (the
/// only stores the verifier allows there).
#[inline(always)]
fn write_address(ip4: &mut u32, ip6: &mut [u32; 4], family: u8, address: &[u8; 16]) {
    let words = crate::remote::words(*address);
    // SAFETY: fields of the context the kernel passed, writable for the
    // program's attach point.
    unsafe {
        if family == 4 {
            core::ptr::write_volatile(ip4, words[0]);
        } else {
            for (i, word) in words.iter().enumerate() {
                core::ptr::write_volatile(&mut ip6[i], *word);
            }
        }
    }
}

/// connect() or sendmsg() to `family`'s address in `ctx`: to a backend
/// when it is a frontend. `connect`: refuse with ECONNREFUSED (else EPERM)
/// when the frontend has no backend.
#[inline(always)]
pub(crate) fn to_backend(ctx: &SockAddrContext, family: u8, connect: bool) -> i32 {
    let addr = ctx.sock_addr;
    let peer = read_peer(addr, family);
    // SAFETY: a field of the context, read once.
    let protocol = unsafe { core::ptr::read_volatile(&(*addr).protocol) } as u8;
    let mut key = ServiceKey {
        address: peer.address,
        port: peer.port,
        protocol,
        family,
    };
    let Some(frontend) = frontend_at(&mut key) else {
        return PROCEED;
    };
    if frontend.count == 0 {
        if connect {
            // SAFETY: plain helper call; the syscall then fails with it.
            unsafe { bpf_set_retval(-ECONNREFUSED) };
        }
        return REFUSE;
    }
    let index = backend_index(ctx, &key, &frontend);
    let backend_key = BackendKey {
        id: frontend.id,
        index,
    };
    // SAFETY: the value is copied at once.
    let Some(backend) = (unsafe { SERVICE_BACKENDS.get(&backend_key) }).copied() else {
        // A set being replaced: the frontend already points at the new one,
        // whose entries were written first; nothing to do but go on.
        return PROCEED;
    };
    write_peer(addr, family, &backend.address, backend.port);
    // A NodePort or hostPort on one of the node's addresses (`frontend_at`
    // found it by the wildcard).
    if key.address == [0; 16] && peer.address != [0; 16] {
        if connect {
            keep_node_source(ctx, family, &peer.address);
        } else {
            keep_node_datagram_source(ctx, family, &peer.address);
        }
    } else if in_node_namespace(ctx) && is_local_pod(&backend.address, family) {
        // A ClusterIP (or other address) of the node's own whose backend
        // is a pod here: kube-proxy's DNAT keeps the source the route to
        // the ClusterIP picked (the node's address, masqueraded to an
        // address of the node's again); the route to the pod would pick
        // the gateway device's.
        if let Some(source) = NODE_SOURCES.get(u32::from(family == 6)).copied()
            && source != [0; 16]
        {
            if connect {
                keep_node_source(ctx, family, &source);
            } else {
                set_datagram_source(ctx, family, &source);
            }
        }
    }
    let revnat_key = RevNatKey {
        // SAFETY: plain helper call on the program's context.
        cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        address: backend.address,
        port: backend.port,
        family,
        _pad: [0; 5],
    };
    let original = RevNat {
        address: peer.address,
        port: peer.port,
        _pad: [0; 2],
    };
    // A failed write (a full LRU evicts instead) only leaves the reply's
    // source as the backend's.
    let _ = SERVICE_REVNAT.insert(&revnat_key, &original, 0);
    PROCEED
}

/// A connect() of the node's own to a NodePort or hostPort on one of its
/// addresses keeps that address as its source, as where kube-proxy's or
/// portmap's DNAT sends it on (for a local destination the kernel picks
/// the destination itself); rewritten to the pod, the route to the pod
/// would pick the gateway device's. In a pod's namespace the address is
/// not local, the bind fails and nothing changes; so it does for a socket
/// already bound.
#[inline(always)]
fn keep_node_source(ctx: &SockAddrContext, family: u8, address: &[u8; 16]) {
    // sockaddr_in and sockaddr_in6, port 0 (the kernel picks one at connect).
    let mut local = [0u8; 28];
    let len = if family == 4 {
        local[..2].copy_from_slice(&u16::from(AF_INET).to_ne_bytes());
        local[4..8].copy_from_slice(&address[..4]);
        16
    } else {
        local[..2].copy_from_slice(&u16::from(AF_INET6).to_ne_bytes());
        local[8..24].copy_from_slice(address);
        28
    };
    // SAFETY: a sockaddr of `len` bytes on the stack; a failure changes
    // nothing.
    let _ = unsafe { bpf_bind(ctx.sock_addr, local.as_mut_ptr().cast::<sockaddr>(), len) };
}

/// sendmsg() of the node's own to a NodePort or hostPort on one of its
/// addresses: the datagram leaves from that address, as `keep_node_source`
/// binds a connect(). Only in the node's namespace (the address is no
/// source a pod's namespace could send from) and only to this node's own
/// addresses (`LOCAL_ADDRS`; NodePorts answer on every node's, and another
/// node's is no source of this one's).
#[inline(always)]
fn keep_node_datagram_source(ctx: &SockAddrContext, family: u8, address: &[u8; 16]) {
    if in_node_namespace(ctx) && policy::is_node_address(address, family) {
        set_datagram_source(ctx, family, address);
    }
}

/// Whether the call comes from the node's own network namespace.
#[inline(always)]
fn in_node_namespace(ctx: &SockAddrContext) -> bool {
    // SAFETY: a read of a constant the loader set (frozen .rodata).
    let node = unsafe { core::ptr::read_volatile(&NODE_NETNS_COOKIE) };
    // SAFETY: plain helper call on the program's context.
    node != 0 && unsafe { bpf_get_netns_cookie(ctx.as_ptr()) } == node
}

/// Whether `address` is a pod on this node (`ENDPOINTS_V4`/`_V6`).
#[inline(always)]
fn is_local_pod(address: &[u8; 16], family: u8) -> bool {
    if family == 4 {
        let key = [address[0], address[1], address[2], address[3]];
        // SAFETY: only the presence is read.
        unsafe { ENDPOINTS_V4.get(&key) }.is_some()
    } else {
        // SAFETY: only the presence is read.
        unsafe { ENDPOINTS_V6.get(address) }.is_some()
    }
}

/// A sendmsg()'s datagram leaves from `address`.
#[inline(always)]
fn set_datagram_source(ctx: &SockAddrContext, family: u8, address: &[u8; 16]) {
    let addr = ctx.sock_addr;
    // SAFETY: writable fields of the context for the sendmsg attach points.
    unsafe {
        write_address(
            &mut (*addr).msg_src_ip4,
            &mut (*addr).msg_src_ip6,
            family,
            address,
        );
    }
}

/// The frontend at `key`'s address, or, at a node address, the NodePort
/// at its port (`key` then holds the wildcard, as affinity keys it).
#[inline(always)]
fn frontend_at(key: &mut ServiceKey) -> Option<ServiceValue> {
    // SAFETY: the value is copied at once.
    if let Some(frontend) = unsafe { SERVICES.get(&*key) } {
        return Some(*frontend);
    }
    if !crate::external_ports::nodeport_listens(u16::from_be_bytes(key.port), key.protocol) {
        return None;
    }
    let node = NodePortAddress {
        address: key.address,
        family: key.family,
        _pad: [0; 3],
    };
    // SAFETY: the value is copied at once.
    let owner = *unsafe { NODEPORT_ADDRS.get(&node) }?;
    let mut wildcard = *key;
    wildcard.address = [0; 16];
    // SAFETY: the value is copied at once.
    let frontend = *unsafe { SERVICES.get(&wildcard) }?;
    // externalTrafficPolicy Local on another node's address: that node's
    // to serve (from its own endpoints, or not at all), as with kube-proxy.
    if frontend.flags & FRONTEND_F_KEEP_CLIENT != 0 && owner == NODEPORT_ADDR_OTHER_NODE {
        return None;
    }
    *key = wildcard;
    Some(frontend)
}

/// Which of `frontend`'s backends this call gets: at random, or with
/// sessionAffinity the one this client had while it is still fresh.
#[inline(always)]
fn backend_index(ctx: &SockAddrContext, key: &ServiceKey, frontend: &ServiceValue) -> u32 {
    if frontend.affinity_secs == 0 {
        // SAFETY: plain helper call.
        return unsafe { bpf_get_prandom_u32() } % frontend.count;
    }
    let client = AffinityKey {
        // SAFETY: plain helper call on the program's context.
        netns_cookie: unsafe { bpf_get_netns_cookie(ctx.as_ptr()) },
        frontend: *key,
        _pad: 0,
    };
    affinity_index(client, frontend, frontend.count)
}

/// One of the first `choices` (at least one) of `frontend`'s backends for
/// `client`: with sessionAffinity the one it had while still fresh and
/// among them, else (and recorded for next time) one at random.
#[inline(always)]
pub(crate) fn affinity_index(client: AffinityKey, frontend: &ServiceValue, choices: u32) -> u32 {
    if frontend.affinity_secs == 0 {
        // SAFETY: plain helper call.
        return unsafe { bpf_get_prandom_u32() } % choices;
    }
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let timeout_ns = u64::from(frontend.affinity_secs) * 1_000_000_000;
    // SAFETY: the value is copied at once.
    let index = match unsafe { SERVICE_AFFINITY.get(&client) }.copied() {
        Some(given)
            if given.id == frontend.id
                && given.index < choices
                && now.saturating_sub(given.last_ns) < timeout_ns =>
        {
            given.index
        }
        // SAFETY: plain helper call.
        _ => (unsafe { bpf_get_prandom_u32() }) % choices,
    };
    let given = Affinity {
        id: frontend.id,
        index,
        last_ns: now,
    };
    // A failed write only means the next connection picks afresh.
    let _ = SERVICE_AFFINITY.insert(&client, &given, 0);
    index
}

/// recvmsg() or getpeername(): a backend this socket was sent to in place
/// of a ClusterIP is shown as that ClusterIP.
#[inline(always)]
pub(crate) fn to_frontend(ctx: &SockAddrContext, family: u8) -> i32 {
    let addr = ctx.sock_addr;
    let peer = read_peer(addr, family);
    let key = RevNatKey {
        // SAFETY: plain helper call on the program's context.
        cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        address: peer.address,
        port: peer.port,
        family,
        _pad: [0; 5],
    };
    // SAFETY: the value is copied at once.
    if let Some(original) = (unsafe { SERVICE_REVNAT.get(&key) }).copied() {
        write_peer(addr, family, &original.address, original.port);
    }
    PROCEED
}
