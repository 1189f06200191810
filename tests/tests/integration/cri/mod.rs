//! flatnet as a Kubernetes node runs it: kubelet never calls a CNI plugin;
//! it asks containerd over CRI, and containerd's CRI plugin runs the node's
//! conflist through libcni. Here a real containerd 1.6 ([`Containerd`],
//! its own root, state and socket) stands for the node's runtime, the
//! [`CriClient`] for kubelet (RunPodSandbox, PodSandboxStatus,
//! CreateContainer, ExecSync, StopPodSandbox, RemovePodSandbox), and the
//! conflist is the one the node agent writes (`render_conflist`): flatnet
//! with flatnet-ipam, the reference bandwidth plugin chained.
//!
//! A [`Node::simulated`] node runs its containerd (and so every plugin,
//! the pods' host veths, routes, qdiscs and portmap's iptables rules) in a
//! network namespace of its own, with an address on a veth into another
//! namespace (`outside`), and chains portmap as well, as the agent's
//! conflist does: hostPort and the bandwidth annotations, end to end.
//!
//! Each test has its own network name, gateway device, pin root, pod CIDR
//! and IPAM dir, so tests run in parallel; everything, containerd's
//! processes and mounts included, is removed on drop, also on failure.
//!
//! The node is in `node`, a sandbox and what is done with it in `sandbox`;
//! the tests are in `sandboxes`, `host_ports`, `bandwidth` and `bench`.

mod node;
mod sandbox;

mod bandwidth;
mod bench;
mod host_ports;
mod sandboxes;
