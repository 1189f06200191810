//! STATUS (1.1.0): could an ADD on this network succeed right now? Ready
//! only when the datapath is loaded or can be (eBPF object embedded, bpffs
//! mounted or mountable, no conflicting pins), the gateway device is not
//! another network's, and the IPAM plugin answers its own STATUS with ready.
//! Forwarding turned off under live pods is code 51 (existing containers
//! cut off from what the host stack forwards).
//! Read-only: nothing is mounted, loaded or created. A kernel without tcx
//! (programs attached as cls_bpf filters instead) is said on stderr.

use std::path::Path;

use crate::config::NetConf;
use crate::delegate::Delegate;
use flatnet_cni::env::{CniEnv, Command};
use flatnet_cni::error::{Error, Result, code};
use flatnet_datapath::bpf::{self};
use flatnet_datapath::netlink::{Forwarding, Netlink, gateway_alias};

const BPFFS_MOUNT: &str = "/sys/fs/bpf";

pub async fn status(env: &CniEnv, conf: &NetConf, stdin: &[u8]) -> Result<()> {
    let mut problems = datapath_problems(conf);
    if let Some(problem) = flatnet_datapath::node::markers::agent_problem(&conf.name, stdin) {
        problems.push(problem);
    }
    if let Some(problem) = gateway_problem(conf).await {
        problems.push(problem);
    }
    // Forwarding turned off under live pods cuts them off from everything
    // the host stack carries: existing containers' connectivity is limited.
    let forwarding = forwarding_problems(conf);
    let mut limited = !forwarding.is_empty();
    problems.extend(forwarding);
    let ipam = conf.require_ipam()?;
    match Delegate::find(ipam, &env.path).and_then(|ipam| ipam.run(Command::Status, stdin)) {
        Ok(_) => {}
        Err(err) => {
            // The IPAM's own 51 (existing pods affected too) is passed on.
            limited = err.code() == code::LIMITED_CONNECTIVITY;
            problems.push(format!(
                "IPAM plugin {ipam} is not ready: {err} (code {})",
                err.code()
            ));
        }
    }
    if bpf::attach_mode() == bpf::AttachMode::Netlink {
        // Ready, but not as a tcx kernel would be: said on stderr, which
        // runtimes log (STATUS has no output on success).
        eprintln!(
            "flatnet: network {}: programs are attached as {}",
            conf.name,
            bpf::attach_mode().describe()
        );
    }
    if problems.is_empty() {
        return Ok(());
    }
    let msg = format!(
        "network {} cannot serve ADD: {}",
        conf.name,
        problems.join("; ")
    );
    if limited {
        return Err(Error::Delegated {
            plugin: "flatnet".into(),
            code: code::LIMITED_CONNECTIVITY,
            msg,
            details: String::new(),
        });
    }
    Err(Error::NotReady(msg))
}

/// What would keep an ADD from loading or reusing the datapath.
fn datapath_problems(conf: &NetConf) -> Vec<String> {
    let mut problems = Vec::new();
    if !bpf::object_is_ebpf() {
        problems.push("the eBPF object embedded in this binary is missing or damaged".into());
    }
    let datapath = match conf.pinned_datapath() {
        Ok(datapath) => datapath,
        Err(e) => {
            problems.push(e.to_string());
            return problems;
        }
    };
    if !bpf::bpffs_is_mounted(datapath.root()) {
        let supported = std::fs::read_to_string("/proc/filesystems").is_ok_and(|list| {
            list.lines()
                .any(|l| l.split_whitespace().last() == Some("bpf"))
        });
        if !supported {
            problems.push("the kernel has no bpf file system (CONFIG_BPF_SYSCALL)".into());
        } else if !Path::new(BPFFS_MOUNT).is_dir() {
            problems.push(format!(
                "bpffs is not mounted and {BPFFS_MOUNT} does not exist"
            ));
        } else if !nix::unistd::geteuid().is_root() {
            problems.push(format!(
                "bpffs is not mounted at {BPFFS_MOUNT} and only root can mount it"
            ));
        }
    }
    if !datapath.is_loaded(conf.datapath)
        && let Some(pinned) = datapath.pinned_mode()
        && pinned != conf.datapath
        && datapath.pod_count().unwrap_or(0) > 0
    {
        problems.push(format!(
            "the {} datapath is pinned with pods attached; \"datapath\": \"{}\" needs them deleted first",
            pinned.as_str(),
            conf.datapath.as_str()
        ));
    }
    problems
}

/// Forwarding off for a family the network's pods have addresses in.
fn forwarding_problems(conf: &NetConf) -> Vec<String> {
    let Ok(endpoints) = conf.pinned_datapath().and_then(|d| d.all_endpoints()) else {
        return Vec::new();
    };
    Forwarding::for_addresses(endpoints.iter().map(|(ip, _)| ip)).problems()
}

/// An ADD refuses a gateway device that another network owns.
async fn gateway_problem(conf: &NetConf) -> Option<String> {
    let host = match Netlink::connect() {
        Ok(host) => host,
        Err(e) => return Some(format!("cannot talk to the kernel (rtnetlink): {e}")),
    };
    let link = match host.link_by_name(&conf.gateway_device).await {
        Ok(link) => link?,
        Err(e) => return Some(e.to_string()),
    };
    let alias = link.alias?;
    (alias.starts_with("flatnet:") && alias != gateway_alias(&conf.name)).then(|| {
        format!(
            "gateway device {} belongs to network {:?}; give this network its own \"bridge\"",
            conf.gateway_device,
            alias.trim_start_matches("flatnet:")
        )
    })
}
