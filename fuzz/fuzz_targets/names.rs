//! libFuzzer target: any UTF-8 string as a spool file name, job id and
//! unit name (tests/fuzz_spec.rs has the properties).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz_spec.rs"]
mod props;

fuzz_target!(|name: &str| {
    if let Err(e) = props::check_name(name) {
        panic!("{e}");
    }
});
