//! Real-Kubernetes cluster tests: what they need on the machine, prepared
//! once and cached outside the checkout (see ../shared/k8s-real.md).

pub mod build;
