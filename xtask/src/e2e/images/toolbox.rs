//! The command-line tools the images share: the toolbox (busybox's applets
//! and Debian's tools where those fall short), and Debian's iptables.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use anyhow::Context;

use super::rootfs::{Origin, Rootfs};
use crate::util::output;

/// A Debian tool of the toolbox: its host file, where it goes, and links
/// to it. Each replaces busybox's applet of the same name.
struct Tool {
    host: &'static str,
    package: &'static str,
    image: &'static str,
    links: &'static [&'static str],
}

/// The toolbox's Debian tools, where busybox-static 1.35 falls short for
/// the e2e suite of 1.20 or has no such applet.
const TOOLBOX_TOOLS: &[Tool] = &[
    // /bin/sh: busybox's sh runs its own applets (its nc, its wget)
    // whatever PATH says; dash runs what PATH finds.
    Tool {
        host: "/usr/bin/dash",
        package: "dash",
        image: "/usr/bin/dash",
        links: &["/usr/bin/sh"],
    },
    // upstream's agnhost has bash (alpine's); no e2e test of sig-network
    // needs it, other suites' scripts might.
    Tool {
        host: "/usr/bin/bash",
        package: "bash",
        image: "/usr/bin/bash",
        links: &[],
    },
    // busybox's nc has no -u (UDP), which the suite's UDP checks use
    // (`echo hostName | nc -w 1 -u`, `nc -zv -u -w 2`), nor -p.
    Tool {
        host: "/usr/bin/nc.openbsd",
        package: "netcat-openbsd",
        image: "/usr/bin/nc.openbsd",
        links: &["/usr/bin/nc"],
    },
    // busybox-static 1.35's `wget -T N` segfaults; the suite runs
    // `wget -q -T 1 -O -` and `wget -T 5 -qO-`.
    Tool {
        host: "/usr/bin/wget",
        package: "wget",
        image: "/usr/bin/wget",
        links: &[],
    },
    Tool {
        host: "/usr/bin/curl",
        package: "curl",
        image: "/usr/bin/curl",
        links: &[],
    },
    // DNS tests: `dig +short`, `dig +notcp/+tcp +noall +answer +search`;
    // the service jig: `nslookup <service FQDN>`.
    Tool {
        host: "/usr/bin/dig",
        package: "bind9-dnsutils",
        image: "/usr/bin/dig",
        links: &[],
    },
    Tool {
        host: "/usr/bin/nslookup",
        package: "bind9-dnsutils",
        image: "/usr/bin/nslookup",
        links: &[],
    },
    Tool {
        host: "/usr/bin/host",
        package: "bind9-host",
        image: "/usr/bin/host",
        links: &[],
    },
    // DNS tests' `getent hosts <name>` (busybox has no getent); glibc's
    // files and dns NSS modules are part of libc.so.6 since 2.34.
    Tool {
        host: "/usr/bin/getent",
        package: "libc-bin",
        image: "/usr/bin/getent",
        links: &[],
    },
    // iproute2: `ss -ant46 'sport = :N'` (NodePort tests' host exec pod)
    // and a full `ip`, as upstream's agnhost has.
    Tool {
        host: "/usr/bin/ip",
        package: "iproute2",
        image: "/usr/bin/ip",
        links: &["/usr/sbin/ip"],
    },
    Tool {
        host: "/usr/bin/ss",
        package: "iproute2",
        image: "/usr/bin/ss",
        links: &[],
    },
    // networking_perf.go runs /usr/local/bin/iperf (iperf 2) in agnhost.
    Tool {
        host: "/usr/bin/iperf",
        package: "iperf",
        image: "/usr/bin/iperf",
        links: &["/usr/local/bin/iperf"],
    },
];

/// busybox-static's binary on the host.
const BUSYBOX_HOST: &str = "/bin/busybox";

/// The command-line tools the e2e suite's pods exec, shared by the test
/// images: busybox-static's applets (seq, timeout, hostname, awk, sleep,
/// nsenter, ...) as links to /bin/busybox, except where a Debian tool of
/// [`TOOLBOX_TOOLS`] takes the name, each with its shared libraries.
pub fn toolbox() -> anyhow::Result<Rootfs> {
    let mut rootfs = Rootfs::base();
    let busybox_origin = Origin::Debian("busybox-static");
    rootfs.binary(Path::new(BUSYBOX_HOST), "/usr/bin/busybox", &busybox_origin)?;
    let mut taken = BTreeSet::new();
    for tool in TOOLBOX_TOOLS {
        rootfs.binary(
            Path::new(tool.host),
            tool.image,
            &Origin::Debian(tool.package),
        )?;
        for path in std::iter::once(&tool.image).chain(tool.links) {
            let name = path.rsplit('/').next().unwrap_or(path);
            taken.insert(name.to_string());
        }
        for link in tool.links {
            // Relative when side by side, as Debian's own links are.
            let target = if Path::new(link).parent() == Path::new(tool.image).parent() {
                tool.image.rsplit('/').next().unwrap_or(tool.image)
            } else {
                tool.image
            };
            rootfs.symlink(link, target)?;
        }
    }
    // glibc loads libgcc_s when a thread is cancelled or unwinds; nothing
    // links it, so ldd does not list it.
    let libgcc = format!("/usr/lib/{}/libgcc_s.so.1", multiarch());
    rootfs.copy(Path::new(&libgcc), &libgcc, &Origin::Debian("libgcc-s1"))?;
    link_applets(&mut rootfs, &taken)?;
    Ok(rootfs)
}

/// busybox-static alone, every applet linked (what upstream's busybox
/// images are: `sh` is busybox's own), on the base.
pub fn busybox_only() -> anyhow::Result<Rootfs> {
    let mut rootfs = Rootfs::base();
    rootfs.binary(
        Path::new(BUSYBOX_HOST),
        "/usr/bin/busybox",
        &Origin::Debian("busybox-static"),
    )?;
    link_applets(&mut rootfs, &BTreeSet::new())?;
    Ok(rootfs)
}

/// A link to /usr/bin/busybox for each of its applets whose name is not
/// `taken` by another tool.
fn link_applets(rootfs: &mut Rootfs, taken: &BTreeSet<String>) -> anyhow::Result<()> {
    let applets = output(Command::new(BUSYBOX_HOST).arg("--list-full"))
        .with_context(|| format!("cannot list {BUSYBOX_HOST}'s applets"))?;
    for applet in applets.lines().map(str::trim).filter(|a| !a.is_empty()) {
        let name = applet.rsplit('/').next().unwrap_or(applet);
        // linuxrc: the initramfs entry point, at the root; nothing to run.
        if name == "busybox" || name == "linuxrc" || taken.contains(name) {
            continue;
        }
        rootfs.symlink(&format!("/{applet}"), "/usr/bin/busybox")?;
    }
    Ok(())
}

/// The names xtables-nft-multi answers to, each a link to it in /usr/sbin.
const IPTABLES_NAMES: &[&str] = &[
    "iptables",
    "iptables-save",
    "iptables-restore",
    "ip6tables",
    "ip6tables-save",
    "ip6tables-restore",
    "iptables-nft",
    "iptables-nft-save",
    "iptables-nft-restore",
    "ip6tables-nft",
    "ip6tables-nft-save",
    "ip6tables-nft-restore",
];

/// Debian's iptables, nft backend whatever the host's alternatives say:
/// xtables-nft-multi with links under the names it dispatches on, and the
/// extension modules it loads at run time from the xtables directory.
pub(super) fn iptables(rootfs: &mut Rootfs) -> anyhow::Result<()> {
    let origin = Origin::Debian("iptables");
    rootfs.binary(
        Path::new("/usr/sbin/xtables-nft-multi"),
        "/usr/sbin/xtables-nft-multi",
        &origin,
    )?;
    for name in IPTABLES_NAMES {
        rootfs.symlink(&format!("/usr/sbin/{name}"), "xtables-nft-multi")?;
    }
    let xtables = format!("/usr/lib/{}/xtables", multiarch());
    rootfs.tree(Path::new(&xtables), &xtables, &origin)
}

/// Debian's multiarch triple for this machine (`x86_64-linux-gnu`).
fn multiarch() -> String {
    format!("{}-linux-gnu", std::env::consts::ARCH)
}
