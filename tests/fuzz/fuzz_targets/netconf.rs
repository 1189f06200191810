//! flatnet's network configuration (stdin), runtimeConfig/args included, and
//! the GC input: any bytes give a value or a typed error, never a panic.
#![no_main]

use flatnet_fuzz::config::NetConf;
use flatnet_cni::runtime::valid_attachments;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(conf) = NetConf::parse(data) {
        // What parses is valid: the checks ADD relies on hold.
        if let Some(mtu) = conf.mtu {
            assert!(flatnet_cni::config::MTU_RANGE.contains(&mtu));
        }
        assert!(!conf.name.is_empty());
        if let Some(mac) = conf.mac {
            assert_eq!(mac[0] & 1, 0, "a multicast MAC got through");
        }
        if let Some(prev) = &conf.prev_result {
            let _ = prev.to_version(conf.version);
        }
    }
    let _ = valid_attachments(data);
});
