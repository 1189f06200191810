//! A fresh machine has IPv4 and IPv6 forwarding off, and flatnet's ADD must
//! turn them on itself: everything the datapath leaves to the host stack is
//! forwarded by it. A machine that ran tests, the bench's reference bridge
//! or an agent has them on, which would hide a plugin that forgot. So every
//! test binary's host-namespace tests start with both off (restored when the
//! binary exits), and every simulated node starts with both off.

use std::sync::Once;
use std::sync::atomic::{AtomicU8, Ordering};

use flatnet_harness::Netns;

/// The two switches, as sysctl(8) names them.
pub const SWITCHES: [&str; 2] = ["net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"];

fn proc_path(name: &str) -> String {
    format!("/proc/sys/{}", name.replace('.', "/"))
}

/// Both switches of the caller's namespace: (IPv4, IPv6), "1" when on.
pub fn host() -> (String, String) {
    let read = |name: &str| {
        std::fs::read_to_string(proc_path(name))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|_| "missing".into())
    };
    (read(SWITCHES[0]), read(SWITCHES[1]))
}

/// Both switches of `netns`: (IPv4, IPv6).
pub fn of(netns: &Netns) -> (String, String) {
    let out = netns.exec(&["sysctl", "-n", SWITCHES[0], SWITCHES[1]]);
    let mut values = out.lines().map(|v| v.trim().to_string());
    (
        values.next().unwrap_or_default(),
        values.next().unwrap_or_default(),
    )
}

/// Turns both switches off in `netns`, as on a fresh node. A new namespace
/// copies IPv4's from the host's, so it is not fresh by itself.
pub fn off_in(netns: &Netns) {
    set_in(netns, '0');
}

/// Turns both switches on in `netns`: a router of the test's own.
pub fn on_in(netns: &Netns) {
    set_in(netns, '1');
}

fn set_in(netns: &Netns, value: char) {
    let args: Vec<String> = SWITCHES.iter().map(|s| format!("{s}={value}")).collect();
    let mut cmd = vec!["sysctl", "-qw"];
    cmd.extend(args.iter().map(String::as_str));
    netns.exec(&cmd);
}

/// What the host's switches were before this binary turned them off
/// (bit 0 IPv4, bit 1 IPv6, bit 7 saved).
static SAVED: AtomicU8 = AtomicU8::new(0);

extern "C" fn restore_host() {
    let saved = SAVED.load(Ordering::SeqCst);
    if saved & 0x80 == 0 {
        return;
    }
    for (bit, name) in SWITCHES.iter().enumerate() {
        let value = if saved & (1 << bit) != 0 { "1" } else { "0" };
        let _ = std::fs::write(proc_path(name), value);
    }
}

/// Once per test binary, before its first host-namespace network: both of
/// the host's switches off, put back as they were when the binary exits.
/// Test binaries run one after another, so no other binary's tests see it.
pub fn pristine_host() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if !flatnet_harness::is_root() {
            return;
        }
        let (v4, v6) = host();
        let saved = 0x80 | u8::from(v4 == "1") | (u8::from(v6 == "1") << 1);
        SAVED.store(saved, Ordering::SeqCst);
        // SAFETY: registers a plain function with no captured state.
        unsafe { libc::atexit(restore_host) };
        for name in SWITCHES {
            let _ = std::fs::write(proc_path(name), "0");
        }
    });
}

/// Puts the caller's namespace's switches back as they were on drop: for a
/// test that turns them off itself.
pub struct Saved((String, String));

impl Saved {
    pub fn host() -> Self {
        Saved(host())
    }
}

impl Drop for Saved {
    fn drop(&mut self) {
        for (name, value) in SWITCHES.iter().zip([&self.0.0, &self.0.1]) {
            if value == "0" || value == "1" {
                let _ = std::fs::write(proc_path(name), value);
            }
        }
    }
}
