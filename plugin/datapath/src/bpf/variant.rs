//! A measurement's cut-down `from_pod` (`flatnet_common::cost_variant`) in
//! front of this network's own on one host veth: `cargo xtask bench` times
//! the program with and without each of its parts on the same traffic.

use aya::programs::SchedClassifier;
use aya::programs::links::{FdLink, LinkOrder};
use aya::programs::tc::{TcAttachOptions, TcAttachType};

use super::attach::pin_link;
use super::load::verify;
use std::path::Path;

use flatnet_common::PROG_FROM_POD;

use super::Datapath;
use crate::DatapathMode;
use crate::error::{Error, Result};

/// A variant as the kernel took it.
#[derive(Debug, Clone, Copy)]
pub struct CostVariant {
    /// Its id (BPF statistics are read by id).
    pub program_id: u32,
    /// Instructions the verifier kept: a constant's untaken branches are
    /// gone, so each variant is only the code it runs.
    pub instructions: u32,
    /// Bytes of machine code the JIT made of them.
    pub jited_bytes: u32,
}

impl Datapath {
    /// Loads this build's `from_pod` as `variant` on this network's pinned
    /// maps and puts it first at the tcx ingress of `ifname` (in the
    /// calling thread's namespace), its link pinned at `link_pin`: the
    /// network's own program runs only when the variant says "next", and
    /// removing the pin takes the variant off.
    pub fn attach_cost_variant(
        &self,
        variant: u32,
        ifname: &str,
        link_pin: &Path,
    ) -> Result<CostVariant> {
        let setting: &'static u32 = flatnet_common::cost_variant::NAMES
            .iter()
            .map(|(known, _)| known)
            .find(|known| **known == variant)
            .ok_or_else(|| Error::Datapath(format!("no cost variant {variant}")))?;
        let mut ebpf = self.load_object(DatapathMode::Tc, setting)?;
        let program: &mut SchedClassifier = ebpf
            .program_mut(PROG_FROM_POD)
            .ok_or_else(|| Error::Datapath(format!("the eBPF object has no {PROG_FROM_POD}")))?
            .try_into()
            .map_err(|e| Error::bpf(format!("{PROG_FROM_POD} as a tc program"), e))?;
        verify(|| program.load()).map_err(|e| Error::bpf("verifying the cost variant", e))?;
        let info = program
            .info()
            .map_err(|e| Error::bpf("reading the cost variant's id", e))?;
        let loaded = CostVariant {
            program_id: info.id(),
            instructions: info.size_translated().unwrap_or(0) / 8,
            jited_bytes: info.size_jitted(),
        };
        let link = program
            .attach_with_options(
                ifname,
                TcAttachType::Ingress,
                TcAttachOptions::TcxOrder(LinkOrder::first()),
            )
            .and_then(|link| program.take_link(link))
            .map_err(|e| Error::bpf(format!("attaching the cost variant to {ifname}"), e))?;
        let link =
            FdLink::try_from(link).map_err(|e| Error::bpf("the cost variant's tcx link", e))?;
        pin_link(link, link_pin)?;
        Ok(loaded)
    }
}
