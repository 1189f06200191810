//! The cgroup v2 socket programs (see `services`): connect() and
//! sendmsg() to a Service's frontend go to a backend; recvmsg() and
//! getpeername() show the frontend again.

use aya_ebpf::macros::cgroup_sock_addr;
use aya_ebpf::programs::SockAddrContext;

use crate::services::{to_backend, to_frontend};

#[cgroup_sock_addr(connect4)]
pub fn service_connect4(ctx: SockAddrContext) -> i32 {
    to_backend(&ctx, 4, true)
}

#[cgroup_sock_addr(connect6)]
pub fn service_connect6(ctx: SockAddrContext) -> i32 {
    to_backend(&ctx, 6, true)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn service_sendmsg4(ctx: SockAddrContext) -> i32 {
    to_backend(&ctx, 4, false)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn service_sendmsg6(ctx: SockAddrContext) -> i32 {
    to_backend(&ctx, 6, false)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn service_recvmsg4(ctx: SockAddrContext) -> i32 {
    to_frontend(&ctx, 4)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn service_recvmsg6(ctx: SockAddrContext) -> i32 {
    to_frontend(&ctx, 6)
}

#[cgroup_sock_addr(getpeername4)]
pub fn service_getpeername4(ctx: SockAddrContext) -> i32 {
    to_frontend(&ctx, 4)
}

#[cgroup_sock_addr(getpeername6)]
pub fn service_getpeername6(ctx: SockAddrContext) -> i32 {
    to_frontend(&ctx, 6)
}
