//! Nodes on different subnets (`--routing`): n1 and n2 share a segment,
//! n3 is on another behind a router (the switch namespace), with no L2
//! adjacency to them. host-gw cannot reach n3; VXLAN between node
//! addresses can, decided per peer in `auto` mode.
//!
//! The tests by what they prove: `routing` (which peers are tunnelled
//! to), `families` (IPv6 pods, an IPv6 underlay) and `tunnel` (XDP mode,
//! restarts and upgrades, spoofing, packets too big). Their shared helpers
//! are in `fixture`.

mod fixture;

mod families;
mod routing;
mod tunnel;
