//! The pod a frame comes from (`Sender`) and its policy state
//! (`PodPolicy`), as the pod veth's programs read them once per frame:
//! kept below the source check (`pod`) and policy (`policy`), which both
//! take them.

/// The pod a frame comes from: its host veth, its counter slot, and
/// whether the bandwidth plugin shapes what it sends (at the host veth's
/// ingress, after the tcx programs).
#[derive(Clone, Copy)]
pub(crate) struct Sender {
    pub(crate) ifindex: u32,
    pub(crate) slot: u32,
    pub(crate) egress_shaped: bool,
    /// Its NetworkPolicy state (`POLICY_PODS`).
    pub(crate) policy: PodPolicy,
    /// The frame's length (for the drop counters).
    pub(crate) len: u32,
}

/// A pod's policy state, as read once per packet.
#[derive(Clone, Copy)]
pub(crate) struct PodPolicy {
    pub(crate) slot: u32,
    pub(crate) flags: u32,
    pub(crate) generation: u32,
}

impl PodPolicy {
    /// Selected by some policy (in either direction).
    #[inline(always)]
    pub(crate) fn selected(&self) -> bool {
        self.flags != 0
    }
}
