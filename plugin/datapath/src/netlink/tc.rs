//! Program attachment: the clsact qdisc and tc filters, and XDP.

use futures::TryStreamExt;
use rtnetlink::LinkUnspec;
use rtnetlink::packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::packet_route::link::{LinkAttribute, LinkXdp};
use rtnetlink::packet_route::tc::{
    TcAttribute, TcBpfFlags, TcFilterBpfOption, TcHandle, TcMessage, TcOption,
};

use super::{EEXIST, EINVAL, ENOENT, Netlink, errno, kernel};
use crate::error::Result;

/// htons(ETH_P_ALL): a filter for every protocol.
const ALL_PROTOCOLS: u16 = 0x0003_u16.to_be();

/// A clsact qdisc's two hooks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcHook {
    Ingress,
    Egress,
}

impl TcHook {
    /// TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS / TC_H_MIN_EGRESS).
    fn parent(self) -> u32 {
        match self {
            TcHook::Ingress => 0xffff_fff2,
            TcHook::Egress => 0xffff_fff3,
        }
    }

    fn name(self) -> &'static str {
        match self {
            TcHook::Ingress => "ingress",
            TcHook::Egress => "egress",
        }
    }
}

impl Netlink {
    /// Adds the clsact qdisc (tc's ingress and egress hooks) to `index`;
    /// one already there is fine.
    pub async fn add_clsact(&self, index: u32) -> Result<()> {
        /// TC_H_CLSACT and its qdisc handle (ffff:), from linux/pkt_sched.h.
        const TC_H_CLSACT: u32 = 0xffff_fff1;
        const CLSACT_HANDLE: u32 = 0xffff_0000;
        let mut message = TcMessage::with_index(index as i32);
        message.header.parent = TcHandle::from(TC_H_CLSACT);
        message.header.handle = TcHandle::from(CLSACT_HANDLE);
        message.attributes.push(TcAttribute::Kind("clsact".into()));
        match self
            .acked(
                RouteNetlinkMessage::NewQueueDiscipline(message),
                NLM_F_CREATE | NLM_F_EXCL,
            )
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(EEXIST) => Ok(()),
            Err(e) => Err(kernel(
                format!("adding the clsact qdisc to interface #{index}"),
                e,
            )),
        }
    }

    /// Puts BPF program `program_fd` (named `name`) at `hook` of `index` as
    /// a direct-action filter with a fixed priority and handle: created when
    /// absent, replaced in one atomic request when present (an upgrade). The
    /// way without tcx, and ADD's quick way (see `bpf::attach`).
    pub async fn set_tc_bpf(
        &self,
        hook: TcHook,
        index: u32,
        program_fd: std::os::fd::RawFd,
        name: &str,
        priority: u16,
        handle: u32,
    ) -> Result<()> {
        let mut message = TcMessage::with_index(index as i32);
        message.header.parent = TcHandle::from(hook.parent());
        message.header.handle = TcHandle::from(handle);
        message.header.info = (u32::from(priority) << 16) | u32::from(ALL_PROTOCOLS);
        message.attributes.push(TcAttribute::Kind("bpf".into()));
        message.attributes.push(TcAttribute::Options(vec![
            TcOption::Bpf(TcFilterBpfOption::ProgFd(program_fd as u32)),
            TcOption::Bpf(TcFilterBpfOption::ProgName(name.into())),
            TcOption::Bpf(TcFilterBpfOption::Flags(TcBpfFlags::DirectAction)),
        ]));
        self.acked(
            RouteNetlinkMessage::NewTrafficFilter(message),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
        .await
        .map_err(|e| {
            kernel(
                format!(
                    "attaching {name} at tc {} of interface #{index}",
                    hook.name()
                ),
                e,
            )
        })
    }

    /// Takes the filter at `priority`/`handle` off `hook` of `index`, if
    /// there is one (a veth moved to tcx).
    pub async fn remove_tc_bpf(
        &self,
        hook: TcHook,
        index: u32,
        priority: u16,
        handle: u32,
    ) -> Result<()> {
        let mut message = TcMessage::with_index(index as i32);
        message.header.parent = TcHandle::from(hook.parent());
        message.header.handle = TcHandle::from(handle);
        message.header.info = (u32::from(priority) << 16) | u32::from(ALL_PROTOCOLS);
        message.attributes.push(TcAttribute::Kind("bpf".into()));
        match self
            .acked(RouteNetlinkMessage::DelTrafficFilter(message), 0)
            .await
        {
            Ok(()) => Ok(()),
            // No filter, or no clsact qdisc at all: nothing to take off.
            Err(e) if matches!(errno(&e), Some(ENOENT) | Some(EINVAL)) => Ok(()),
            Err(e) => Err(kernel(
                format!(
                    "removing the tc {} filter from interface #{index}",
                    hook.name()
                ),
                e,
            )),
        }
    }

    /// Attaches an XDP program (by fd) in driver mode through plain netlink,
    /// replacing one already there: unlike a bpf_link it outlives this
    /// process, and goes away with the device.
    pub async fn set_xdp(&self, index: u32, program_fd: std::os::fd::RawFd) -> Result<()> {
        /// XDP_FLAGS_DRV_MODE from linux/if_link.h.
        const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
        let message = LinkUnspec::new_with_index(index)
            .append_extra_attribute(LinkAttribute::Xdp(vec![
                LinkXdp::Fd(program_fd),
                LinkXdp::Flags(XDP_FLAGS_DRV_MODE),
            ]))
            .build();
        self.handle
            .link()
            .set(message)
            .execute()
            .await
            .map_err(|e| kernel(format!("attaching XDP to interface #{index}"), e))
    }

    /// The tc filters at the ingress (or egress) hook of `index`; none
    /// when it has no clsact qdisc.
    async fn filters(&self, index: u32, egress: bool) -> Result<Vec<TcMessage>> {
        let request = self.handle.traffic_filter(index as i32).get();
        let mut stream = if egress {
            request.egress()
        } else {
            request.ingress()
        }
        .execute();
        let mut found = Vec::new();
        loop {
            match stream.try_next().await {
                Ok(Some(message)) => found.push(message),
                Ok(None) => break,
                Err(e) if matches!(errno(&e), Some(ENOENT) | Some(EINVAL)) => break,
                Err(e) => {
                    return Err(kernel(
                        format!("listing tc filters on interface #{index}"),
                        e,
                    ));
                }
            }
        }
        Ok(found)
    }

    /// The qdiscs on `index`, as (parent handle, kind): the shapers another
    /// plugin put there (`tbf` at the root, `ingress`).
    pub async fn qdiscs(&self, index: u32) -> Result<Vec<(u32, String)>> {
        let mut stream = self.handle.qdisc().get().index(index as i32).execute();
        let mut found = Vec::new();
        loop {
            match stream.try_next().await {
                Ok(Some(msg)) if msg.header.index == index as i32 => {
                    let kind = msg.attributes.iter().find_map(|attr| match attr {
                        TcAttribute::Kind(kind) => Some(kind.clone()),
                        _ => None,
                    });
                    if let Some(kind) = kind {
                        found.push((u32::from(msg.header.parent), kind));
                    }
                }
                // A dump may list other devices' qdiscs too.
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => {
                    return Err(kernel(
                        format!("listing the qdiscs of interface #{index}"),
                        e,
                    ));
                }
            }
        }
        Ok(found)
    }

    /// IDs of the BPF programs attached as tc ingress filters on `index`.
    pub async fn tc_ingress_programs(&self, index: u32) -> Result<Vec<(u32, String)>> {
        self.tc_programs(index, TcHook::Ingress).await
    }

    /// The BPF programs of the cls_bpf filters at `hook` of `index`: (id, name).
    pub async fn tc_programs(&self, index: u32, hook: TcHook) -> Result<Vec<(u32, String)>> {
        let mut found = Vec::new();
        for message in self.filters(index, hook == TcHook::Egress).await? {
            for attr in &message.attributes {
                let TcAttribute::Options(options) = attr else {
                    continue;
                };
                let mut id = None;
                let mut name = String::new();
                for option in options {
                    match option {
                        TcOption::Bpf(TcFilterBpfOption::ProgId(prog)) => id = Some(*prog),
                        TcOption::Bpf(TcFilterBpfOption::ProgName(prog)) => name = prog.clone(),
                        _ => {}
                    }
                }
                if let Some(id) = id {
                    found.push((id, name));
                }
            }
        }
        Ok(found)
    }
}
