//! The images critest (cri-tools' CRI validation suite) pulls, as
//! stand-ins: each written from Debian's binaries, named exactly as critest
//! 1.37.0 asks for it (`pkg/validate/consts*.go`, `pkg/framework/util.go`)
//! and pushed into a registry on loopback (`cargo xtask critest`).
//!
//! Upstream builds its `gcr.io/k8s-staging-cri-tools/test-image-*` images
//! from busybox 1.37 (cri-tools' `images/` folder: a file named after the
//! image, or a `USER`); here they are busybox-static 1.35 with the same
//! file or the same `User`, and upstream busybox's /etc/passwd and
//! /etc/group. What differs is said at each image. One image cannot be
//! stood in for at all: `test-image-digest` is asked for by upstream's
//! manifest digest, which no other content has.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use super::PAUSE;
use super::rootfs::{Origin, Rootfs};
use super::spec::{ImageSpec, architecture};
use super::test_images::static_server_script;
use super::toolbox::busybox_only;
use crate::util::run_cmd;

/// critest's own images' registry and repository prefix.
const CRI_TOOLS: &str = "gcr.io/k8s-staging-cri-tools";
const E2E: &str = "registry.k8s.io/e2e-test-images";

/// The passwd and group files of upstream's busybox image (uids and gids
/// as there: www-data is 33).
const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
    daemon:x:1:1:daemon:/usr/sbin:/bin/false\n\
    bin:x:2:2:bin:/bin:/bin/false\n\
    sys:x:3:3:sys:/dev:/bin/false\n\
    sync:x:4:100:sync:/bin:/bin/sync\n\
    mail:x:8:8:mail:/var/spool/mail:/bin/false\n\
    www-data:x:33:33:www-data:/var/www:/bin/false\n\
    operator:x:37:37:Operator:/var:/bin/false\n\
    nobody:x:65534:65534:nobody:/home:/bin/false\n";
const GROUP: &str = "root:x:0:\ndaemon:x:1:\nbin:x:2:\nsys:x:3:\nadm:x:4:\ntty:x:5:\n\
    disk:x:6:\nlp:x:7:\nmail:x:8:\nkmem:x:9:\nwheel:x:10:root\ncdrom:x:11:\n\
    dialout:x:18:\nfloppy:x:19:\nvideo:x:28:\naudio:x:29:\ntape:x:32:\n\
    www-data:x:33:\noperator:x:37:\nutmp:x:43:\nplugdev:x:46:\nstaff:x:50:\n\
    lock:x:54:\nnetdev:x:82:\nusers:x:100:\nnogroup:x:65534:\n";

/// busybox-static with upstream busybox's users and groups, and two
/// tools upstream's busybox has as applets and Debian's busybox-static
/// lacks: `pgrep` (critest's sleep check) and `ipcs` (its IPC namespace
/// specs), from procps and util-linux.
fn busybox_rootfs() -> anyhow::Result<Rootfs> {
    let mut rootfs = busybox_only()?;
    rootfs.binary(
        Path::new("/usr/bin/pgrep"),
        "/usr/bin/pgrep",
        &Origin::Debian("procps"),
    )?;
    rootfs.binary(
        Path::new("/usr/bin/ipcs"),
        "/usr/bin/ipcs",
        &Origin::Debian("util-linux"),
    )?;
    rootfs.replace_bytes("/etc/passwd", PASSWD.as_bytes(), 0o644)?;
    rootfs.replace_bytes("/etc/group", GROUP.as_bytes(), 0o644)?;
    Ok(rootfs)
}

/// A busybox image holding an empty file `/<file>` (upstream's
/// `image-test`: `ADD ${TEST} ${TEST}`), under `names`.
fn with_file(names: &[String], file: &str) -> anyhow::Result<ImageSpec> {
    let mut rootfs = busybox_rootfs()?;
    rootfs.bytes(&format!("/{file}"), b"", 0o644)?;
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    Ok(ImageSpec::new(&names, rootfs).cmd(&["sh"]))
}

/// A busybox image whose config's `User` is `user` (upstream's
/// `image-user`).
fn with_user(image: &str, user: &str) -> anyhow::Result<ImageSpec> {
    Ok(
        ImageSpec::new(&[&format!("{CRI_TOOLS}/{image}:latest")], busybox_rootfs()?)
            .cmd(&["sh"])
            .user(user),
    )
}

/// upstream's `image-predefined-group`: default-user (uid 1000) in the
/// image's own group-defined-in-image (gid 50000), `USER 1000`.
fn predefined_group() -> anyhow::Result<ImageSpec> {
    let mut rootfs = busybox_rootfs()?;
    let passwd =
        format!("{PASSWD}default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh\n");
    let group =
        format!("{GROUP}default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n");
    rootfs.replace_bytes("/etc/passwd", passwd.as_bytes(), 0o644)?;
    rootfs.replace_bytes("/etc/group", group.as_bytes(), 0o644)?;
    rootfs.dir("/home/default-user", 0o755)?;
    Ok(ImageSpec::new(
        &[&format!("{CRI_TOOLS}/test-image-predefined-group:latest")],
        rootfs,
    )
    .cmd(&["sh"])
    .user("1000"))
}

/// A web server stand-in: busybox's httpd serving an index.html from
/// `root` on `port`, started by `script` (which ignores its arguments and
/// first prints `banner`, for the specs that look for it in the log).
fn web_server(
    names: &[&str],
    stands_in_for: &str,
    root: &str,
    port: u16,
    script: &str,
) -> anyhow::Result<ImageSpec> {
    let mut rootfs = busybox_rootfs()?;
    rootfs.bytes(
        &format!("{root}/index.html"),
        format!("<html><body><h1>{stands_in_for} (a stand-in)</h1></body></html>\n").as_bytes(),
        0o644,
    )?;
    let serve = static_server_script(stands_in_for, root, port);
    let text = serve.replacen(
        "trap",
        &format!("echo \"{stands_in_for}: serving {root} on port {port}\"\ntrap"),
        1,
    );
    rootfs.bytes(script, text.as_bytes(), 0o755)?;
    Ok(ImageSpec::new(names, rootfs).cmd(&[script]))
}

/// `nnp`: prints its effective uid. Installed setuid root, it shows
/// whether no_new_privs kept the setuid bit from working (upstream's
/// nonewprivs image does the same with a program of its own).
const NNP_C: &str = r#"#include <stdio.h>
#include <unistd.h>
int main(void) {
    printf("Effective uid: %d\n", (int)geteuid());
    return 0;
}
"#;

/// The nginx stand-in's master process, at /usr/sbin/nginx: as nginx's
/// master, it is named `nginx` (`pidof nginx`), shows "nginx: master
/// process" in its command line and writes its pid to
/// /var/run/nginx.pid, which critest's PID-namespace specs look for; its
/// "worker" is busybox's httpd serving `$NGINX_ROOT` on `$NGINX_PORT`.
/// It exits on SIGTERM/SIGINT, taking httpd with it.
const NGINX_C: &str = r#"#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#define MASTER "nginx: master process nginx -g daemon off;"
static pid_t worker;
static void quit(int sig) { (void)sig; if (worker > 0) kill(worker, SIGTERM); _exit(0); }
int main(int argc, char **argv) {
    if (argc < 1 || strcmp(argv[0], MASTER) != 0) {
        char *args[] = {MASTER, NULL};
        execv("/usr/sbin/nginx", args);
        perror("execv /usr/sbin/nginx");
        return 1;
    }
    const char *port = getenv("NGINX_PORT");
    const char *root = getenv("NGINX_ROOT");
    if (!port) port = "80";
    if (!root) root = "/usr/share/nginx/html";
    FILE *pid_file = fopen("/var/run/nginx.pid", "w");
    if (pid_file) { fprintf(pid_file, "%d\n", (int)getpid()); fclose(pid_file); }
    signal(SIGTERM, quit);
    signal(SIGINT, quit);
    printf("nginx (a stand-in): busybox httpd serving %s on port %s\n", root, port);
    fflush(stdout);
    worker = fork();
    if (worker == 0) {
        execl("/usr/bin/busybox", "httpd", "-f", "-v", "-p", port, "-h", root, (char *)NULL);
        perror("execl busybox httpd");
        _exit(1);
    }
    int status = 0;
    while (waitpid(worker, &status, 0) < 0) {}
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
"#;

/// Compiles `source` statically into `dir/name` (when not there yet).
fn compiled(dir: &Path, name: &str, source: &str) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let source_path = dir.join(format!("{name}.c"));
    let binary = dir.join(name);
    let unchanged = std::fs::read_to_string(&source_path).is_ok_and(|text| text == source);
    if unchanged && binary.is_file() {
        return Ok(binary);
    }
    std::fs::write(&source_path, source)
        .with_context(|| format!("cannot write {}", source_path.display()))?;
    run_cmd(
        Command::new("gcc")
            .args(["-Os", "-static", "-s", "-Wall", "-Werror", "-o"])
            .arg(&binary)
            .arg(&source_path),
    )
    .with_context(|| {
        format!("cannot compile {name}: gcc and libc6-dev (for the static libc) are needed")
    })?;
    Ok(binary)
}

/// The nginx stand-in (see [`NGINX_C`]) serving an index.html from
/// `root` on `port`. No nginx.conf, no reverse proxy: critest only
/// fetches its main page and looks at its process.
fn nginx(names: &[&str], root: &str, port: u16, work: &Path) -> anyhow::Result<ImageSpec> {
    let mut rootfs = busybox_rootfs()?;
    rootfs.bytes(
        &format!("{root}/index.html"),
        b"<html><body><h1>nginx (a stand-in)</h1></body></html>\n",
        0o644,
    )?;
    rootfs.copy(
        &compiled(work, "nginx", NGINX_C)?,
        "/usr/sbin/nginx",
        &Origin::Built("compiled by cargo xtask critest".to_string()),
    )?;
    rootfs.dir("/var/run", 0o755)?;
    let mut spec = ImageSpec::new(names, rootfs).cmd(&["nginx", "-g", "daemon off;"]);
    spec.env.push(format!("NGINX_PORT={port}"));
    spec.env.push(format!("NGINX_ROOT={root}"));
    Ok(spec)
}

/// Every image critest pulls (but `test-image-digest`), plus the sandbox
/// image containerd pulls for each pod. `pause` is the static pause of the
/// Kubernetes cache; `work` is where nnp is compiled.
pub fn critest_images(pause: &Path, work: &Path) -> anyhow::Result<Vec<ImageSpec>> {
    let built = Origin::Built("build it with `cargo xtask e2e-build`".to_string());
    let pause_rootfs = |version: Option<&str>| -> anyhow::Result<Rootfs> {
        let mut rootfs = Rootfs::new();
        rootfs.copy(pause, "/pause", &built)?;
        if let Some(version) = version {
            // As upstream's 3.9 and 3.10 differ, so do these two: the image
            // critest pulls and removes is not the sandboxes' image.
            rootfs.bytes("/VERSION", format!("{version}\n").as_bytes(), 0o644)?;
        }
        Ok(rootfs)
    };
    let mut specs = vec![
        ImageSpec::new(&[PAUSE], pause_rootfs(None)?).entrypoint(&["/pause"]),
        ImageSpec::new(
            &["registry.k8s.io/pause:3.9", "k8s.gcr.io/pause:3.9"],
            pause_rootfs(Some("3.9"))?,
        )
        .entrypoint(&["/pause"]),
        // The default test image: busybox, `sh`.
        ImageSpec::new(&[&format!("{E2E}/busybox:1.29-2")], busybox_rootfs()?).cmd(&["sh"]),
        nginx(
            &[&format!("{E2E}/nginx:1.14-2")],
            "/usr/share/nginx/html",
            80,
            work,
        )?,
        // Apache httpd 2.4 on port 80, saying "httpd" in its log as
        // Apache does when it starts: busybox's httpd.
        web_server(
            &[&format!("{E2E}/httpd:2.4.39-4")],
            "httpd",
            "/usr/local/apache2/htdocs",
            80,
            "/usr/local/bin/httpd-foreground",
        )?,
        // hostnet-nginx: nginx on 12003, for the host-network specs.
        nginx(
            &[&format!(
                "{CRI_TOOLS}/hostnet-nginx-{}:latest",
                architecture()
            )],
            "/usr/share/nginx/html",
            12003,
            work,
        )?,
    ];
    let mut nnp = busybox_rootfs()?;
    nnp.bytes(
        "/usr/local/bin/nnp",
        &std::fs::read(compiled(work, "nnp", NNP_C)?).context("cannot read the compiled nnp")?,
        0o4755,
    )?;
    specs.push(
        ImageSpec::new(&[&format!("{E2E}/nonewprivs:1.3")], nnp)
            .entrypoint(&["/usr/local/bin/nnp"]),
    );
    let name = |image: &str, tag: &str| format!("{CRI_TOOLS}/{image}:{tag}");
    specs.push(with_file(
        &[name("test-image-latest", "latest")],
        "test-image-latest",
    )?);
    for tag in ["test", "all"] {
        specs.push(with_file(&[name("test-image-tag", tag)], tag)?);
    }
    specs.push(with_file(
        &["1", "2", "3"].map(|tag| name("test-image-tags", tag)),
        "same-image",
    )?);
    for image in ["test-image-1", "test-image-2", "test-image-3"] {
        specs.push(with_file(&[name(image, "latest")], image)?);
    }
    for (image, user) in [
        ("test-image-user-uid", "1002"),
        ("test-image-user-username", "www-data"),
        ("test-image-user-uid-group", "1003:1004"),
        ("test-image-user-username-group", "www-data:1004"),
    ] {
        specs.push(with_user(image, user)?);
    }
    specs.push(predefined_group()?);
    Ok(specs)
}
