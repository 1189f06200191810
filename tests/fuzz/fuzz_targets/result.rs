//! CNI results (prevResult, an IPAM plugin's answer): whatever parses is
//! written in every version and reads back with the same addresses.
#![no_main]

use flatnet_cni::result::CniResult;
use flatnet_cni::version::{SUPPORTED, SpecVersion};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Ok(result) = CniResult::from_value(&value, "fuzz") else {
        return;
    };
    for version in SUPPORTED {
        let Ok(version) = SpecVersion::parse(version) else {
            panic!("a supported version does not parse");
        };
        let written = result.to_version(version);
        let read = match CniResult::from_value(&written, "round trip") {
            Ok(read) => read,
            Err(e) => panic!("{version:?} output does not read back: {e}: {written}"),
        };
        assert_eq!(read.ips.len(), result.ips.len());
        for (a, b) in read.ips.iter().zip(&result.ips) {
            assert_eq!(a.address, b.address);
            assert_eq!(a.interface, b.interface);
        }
        assert_eq!(read.interfaces.len(), result.interfaces.len());
    }
    // After an earlier result, as ADD later in a chain writes it.
    let merged = result.clone().after(&result);
    assert!(CniResult::from_value(&merged.to_version(SpecVersion::V1_1_0), "merged").is_ok());
});
