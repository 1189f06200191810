//! Empty on purpose: the datapath is the `flatnet-ebpf` binary target (src/main.rs),
//! built for bpfel-unknown-none by the plugin's build script.
#![no_std]
