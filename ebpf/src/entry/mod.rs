//! The programs, one file per attach point: the pod veth's (`pod_veth`),
//! the uplink's (`uplink`), the VXLAN device's (`tunnel`) and the cgroup's
//! socket calls (`socket`). Each program is a few lines over the logic of
//! the feature modules.

mod pod_veth;
mod socket;
mod tunnel;
mod uplink;
