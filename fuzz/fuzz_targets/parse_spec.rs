//! libFuzzer target: any bytes as a descriptor. The properties checked are
//! those of the stable fuzz test (tests/fuzz_spec.rs), shared by path.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz_spec.rs"]
mod props;

fuzz_target!(|data: &[u8]| {
    // The default id (the spool file's stem) varies with the input too:
    // its first line when that is short, else a fixed valid one.
    let default_id = data
        .split(|b| *b == b'\n')
        .next()
        .filter(|l| l.len() <= 80)
        .and_then(|l| std::str::from_utf8(l).ok())
        .unwrap_or("fuzz");
    if let Err(e) = props::check_parse(data, default_id) {
        panic!("{e}");
    }
});
