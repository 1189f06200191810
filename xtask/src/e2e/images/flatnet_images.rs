//! flatnet's own images, from the caller's build: the agent's DaemonSet
//! image and the cluster DNS server's.

use std::path::{Path, PathBuf};

use super::rootfs::{Origin, Rootfs};
use super::spec::ImageSpec;
use super::toolbox::iptables;
use super::{CLUSTER_DNS, FLATNET};

/// Where flatnet's own binaries are (the caller's build).
#[derive(Clone, Debug)]
pub struct FlatnetBinaries {
    /// flatnet-agent, dynamically linked (target/release/flatnet-agent).
    pub agent: PathBuf,
    /// The static plugins (target/<host triple>/release/flatnet, -ipam).
    pub plugin: PathBuf,
    pub ipam: PathBuf,
}

impl FlatnetBinaries {
    /// Where `cargo xtask build [--release]` puts them.
    pub fn of_build(release: bool) -> anyhow::Result<Self> {
        Ok(FlatnetBinaries {
            agent: crate::util::binary(release, crate::util::AGENT_PACKAGE)?,
            plugin: crate::util::binary(release, "flatnet")?,
            ipam: crate::util::binary(release, "flatnet-ipam")?,
        })
    }
}

/// The agent's DaemonSet image, as xtask/deploy/Containerfile builds it on
/// Debian: the agent and the two plugins in /usr/local/bin, the reference
/// CNI plugins of `reference_plugins` in /usr/lib/cni (installed onto
/// nodes that lack them or have older ones), nft (ipMasq sets), iptables
/// (portmap's DEL in the reclaim loop) and ip (taking an old XDP program
/// off a device).
pub fn flatnet(binaries: &FlatnetBinaries, reference_plugins: &Path) -> anyhow::Result<ImageSpec> {
    let build = Origin::Built("build it with `cargo xtask build --release`".to_string());
    let mut rootfs = Rootfs::base();
    rootfs.binary(&binaries.agent, "/usr/local/bin/flatnet-agent", &build)?;
    rootfs.binary(&binaries.plugin, "/usr/local/bin/flatnet", &build)?;
    rootfs.binary(&binaries.ipam, "/usr/local/bin/flatnet-ipam", &build)?;
    rootfs.tree(
        reference_plugins,
        "/usr/lib/cni",
        &Origin::Built(
            "the CNI reference plugins are built by `cargo xtask e2e-build`".to_string(),
        ),
    )?;
    rootfs.binary(
        Path::new("/usr/sbin/nft"),
        "/usr/sbin/nft",
        &Origin::Debian("nftables"),
    )?;
    iptables(&mut rootfs)?;
    rootfs.binary(
        Path::new("/usr/bin/ip"),
        "/usr/bin/ip",
        &Origin::Debian("iproute2"),
    )?;
    rootfs.symlink("/usr/sbin/ip", "../bin/ip")?;
    Ok(ImageSpec::new(&[FLATNET], rootfs).entrypoint(&["/usr/local/bin/flatnet-agent"]))
}

/// What to do when the cluster DNS server's binary is missing.
pub(super) fn cluster_dns_origin() -> Origin {
    Origin::Built(
        "build it with `cargo build --release -p flatnet-cluster-dns` (tests/cluster-dns)"
            .to_string(),
    )
}

/// The cluster DNS server's image (tests/cluster-dns): the binary at
/// `binary` with its libraries, on the base (nsswitch.conf, /tmp).
pub fn cluster_dns(binary: &Path) -> anyhow::Result<ImageSpec> {
    let mut rootfs = Rootfs::base();
    rootfs.binary(
        binary,
        "/usr/local/bin/flatnet-cluster-dns",
        &cluster_dns_origin(),
    )?;
    Ok(ImageSpec::new(&[CLUSTER_DNS], rootfs).entrypoint(&["/usr/local/bin/flatnet-cluster-dns"]))
}

/// Where the cluster DNS server's binary is: tests/cluster-dns built with
/// `cargo build --release -p flatnet-cluster-dns`.
pub fn cluster_dns_binary(release: bool) -> PathBuf {
    crate::util::target_dir(release).join("flatnet-cluster-dns")
}
