//! The images the e2e suite's pods and the nodes' sandboxes run (pause,
//! agnhost, busybox, nginx, httpd, ...), most on the shared toolbox.

use std::path::Path;

use super::flatnet_images::cluster_dns_origin;
use super::release_names;
use super::rootfs::{Origin, Rootfs};
use super::spec::ImageSpec;
use super::toolbox::{iptables, toolbox};
use super::{
    AGNHOST, BUSYBOX, DISTROLESS_IPTABLES, GLIBC_DNS_TESTING, JESSIE_DNSUTILS, NGINX, PAUSE,
    REGRESSION_74839,
};
use crate::e2e::build::Built;

/// The sandbox image: the static pause program of the Kubernetes cache
/// (`bin/pause`, built by `cargo xtask e2e-build`) and nothing else.
pub fn pause(kube: &Built) -> anyhow::Result<ImageSpec> {
    let mut rootfs = Rootfs::new();
    rootfs.copy(&kube.bin("pause"), "/pause", &built_by_e2e_build())?;
    Ok(ImageSpec::new(&[PAUSE], rootfs).entrypoint(&["/pause"]))
}

fn built_by_e2e_build() -> Origin {
    Origin::Built("build it with `cargo xtask e2e-build`".to_string())
}

/// The e2e suite's utility image: the toolbox plus agnhost from the
/// Kubernetes cache, laid out as upstream's Dockerfile does (`/agnhost`,
/// the `/agnhost-2` link the entrypoint tests run, porter's TLS pair in
/// `/`, netexec's `/uploads`, fake-registry-server's `/var/registry`). Upstream also has `/coredns` (CoreDNS
/// 1.6.2), which no Debian package or vendored source provides; in its
/// place, the cluster DNS server at `cluster_dns` ([`cluster_dns_binary`])
/// with its libraries: run as `/coredns -conf FILE` it serves the hosts
/// entries of the Corefile that "DNS should support configurable pod
/// resolv.conf" and the dns_configmap tests give it (tests/cluster-dns,
/// its CoreDNS mode).
///
/// [`cluster_dns_binary`]: super::flatnet_images::cluster_dns_binary
pub fn agnhost(kube: &Built, cluster_dns: &Path) -> anyhow::Result<ImageSpec> {
    let mut rootfs = toolbox()?;
    rootfs.binary(&kube.bin("agnhost"), "/agnhost", &built_by_e2e_build())?;
    rootfs.symlink("/agnhost-2", "agnhost")?;
    rootfs.binary(cluster_dns, "/coredns", &cluster_dns_origin())?;
    let porter = kube.source_dir.join("test/images/agnhost/porter");
    for name in ["localhost.crt", "localhost.key"] {
        rootfs.copy(
            &porter.join(name),
            &format!("/{name}"),
            &Origin::Built(
                "it is in the Kubernetes source tree: run `cargo xtask e2e-build`".to_string(),
            ),
        )?;
    }
    rootfs.dir("/uploads", 0o755)?;
    // fake-registry-server's image (upstream's holds pause as pause:testing).
    super::registry_layout::add_image(&mut rootfs, "pause", "testing", &pause(kube)?)?;
    Ok(ImageSpec::new(AGNHOST, rootfs)
        .entrypoint(&["/agnhost"])
        .cmd(&["pause"]))
}

/// regression-issue-74839: "KubeProxy should resolve connection reset issue
/// #74839" sends an out-of-window TCP segment from it. Its source finds its
/// address in `POD_IP`; where a spec does not set it, the image sets it
/// from the pod's own /etc/hosts before it starts.
pub fn regression_issue_74839(kube: &Built) -> anyhow::Result<ImageSpec> {
    let mut rootfs = toolbox()?;
    rootfs.binary(
        &kube.bin("regression-issue-74839"),
        "/regression-issue-74839",
        &built_by_e2e_build(),
    )?;
    Ok(ImageSpec::new(&[REGRESSION_74839], rootfs).entrypoint(&[
        "/bin/sh",
        "-c",
        "POD_IP=\"${POD_IP:-$(hostname -i)}\" exec /regression-issue-74839",
    ]))
}

/// busybox, as the suite's generic shell image: the toolbox, `sh`.
pub fn busybox() -> anyhow::Result<ImageSpec> {
    Ok(ImageSpec::new(&[BUSYBOX], toolbox()?).cmd(&["sh"]))
}

/// glibc-dns-testing (upstream: Debian with dnsutils, for glibc's
/// resolver), also named jessie-dnsutils as 1.35's DNS specs ask: the
/// toolbox is Debian's glibc userland with dig and getent.
pub fn glibc_dns_testing() -> anyhow::Result<ImageSpec> {
    Ok(ImageSpec::new(&[GLIBC_DNS_TESTING, JESSIE_DNSUTILS], toolbox()?).cmd(&["sh"]))
}

/// Stands in for the e2e nginx images: the toolbox, and busybox's httpd
/// serving nginx's document root `/usr/share/nginx/html` (an index.html) on
/// port 80, started by an `nginx` script that ignores its arguments so the
/// upstream `nginx -g 'daemon off;'` command works. What differs: it is no
/// nginx (no nginx.conf, no reverse proxy, no `nginx -s`), the tools are
/// the toolbox's rather than alpine's, and it exits on SIGTERM at once.
pub fn nginx() -> anyhow::Result<ImageSpec> {
    let mut rootfs = toolbox()?;
    rootfs.bytes(
        "/usr/share/nginx/html/index.html",
        b"<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head>\n\
          <body><h1>Welcome to nginx!</h1></body></html>\n",
        0o644,
    )?;
    rootfs.bytes(
        "/usr/sbin/nginx",
        static_server_script("nginx", "/usr/share/nginx/html", 80).as_bytes(),
        0o755,
    )?;
    Ok(ImageSpec::new(NGINX, rootfs).cmd(&["nginx", "-g", "daemon off;"]))
}

/// A start script serving `root` on `port` with busybox's httpd in the
/// foreground. The shell stays PID 1 with a TERM trap: as PID 1, busybox's
/// httpd would ignore SIGTERM and every pod deletion would wait out its
/// grace period.
pub(super) fn static_server_script(stands_in_for: &str, root: &str, port: u16) -> String {
    format!(
        "#!/bin/sh\n\
         # Stands in for {stands_in_for} (flatnet's e2e images): busybox's httpd\n\
         # serves {root} on port {port}; arguments are ignored.\n\
         trap 'exit 0' TERM INT\n\
         /usr/bin/busybox httpd -f -v -p {port} -h {root} &\n\
         wait $!\n"
    )
}

/// distroless-iptables (upstream: iptables and conntrack on a distroless
/// base): the toolbox with iptables (nft backend) and conntrack.
pub fn distroless_iptables() -> anyhow::Result<ImageSpec> {
    let mut rootfs = toolbox()?;
    iptables(&mut rootfs)?;
    rootfs.binary(
        Path::new("/usr/sbin/conntrack"),
        "/usr/sbin/conntrack",
        &Origin::Debian("conntrack"),
    )?;
    Ok(ImageSpec::new(&[DISTROLESS_IPTABLES], rootfs).cmd(&["/bin/sh"]))
}

/// Every image the e2e suite's pods and the nodes' sandboxes use (not
/// flatnet's own two; agnhost carries the cluster DNS server at
/// `cluster_dns`, the caller's build of it, as `/coredns`), each also under
/// the tags `kube`'s release asks for.
pub fn test_images(kube: &Built, cluster_dns: &Path) -> anyhow::Result<Vec<ImageSpec>> {
    let listed = release_names::listed(kube)?;
    let mut images = vec![
        pause(kube)?,
        agnhost(kube, cluster_dns)?,
        busybox()?,
        glibc_dns_testing()?,
        nginx()?,
        distroless_iptables()?,
        regression_issue_74839(kube)?,
    ];
    for image in &mut images {
        release_names::add_release_names(image, &listed);
    }
    Ok(images)
}
