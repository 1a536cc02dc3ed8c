//! Snapshots of the `tally` CLI's help, so a change to what users read is a reviewed change.

use std::process::Command;

fn help(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(args)
        .output()
        .expect("tally runs");
    assert!(output.status.success(), "{args:?} --help exits 0");
    String::from_utf8(output.stdout).expect("utf-8 help")
}

#[test]
fn top_level_help_lists_every_command_and_the_exit_codes() {
    insta::assert_snapshot!("tally_help", help(&["--help"]));
}

#[test]
fn hold_help_lists_every_hold_command() {
    insta::assert_snapshot!("tally_hold_help", help(&["hold", "--help"]));
}

#[test]
fn params_help_explains_retention_and_sizing() {
    insta::assert_snapshot!("tally_params_help", help(&["params", "--help"]));
}

#[test]
fn alarm_help_lists_list_and_clear() {
    insta::assert_snapshot!("tally_alarm_help", help(&["alarm", "--help"]));
    insta::assert_snapshot!(
        "tally_alarm_clear_help",
        help(&["alarm", "clear", "--help"])
    );
}

#[test]
fn bench_help_explains_its_knobs() {
    insta::assert_snapshot!("tally_bench_help", help(&["bench", "--help"]));
}

#[test]
fn bad_usage_exits_2() {
    let output = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(["hold", "authorize"])
        .output()
        .expect("runs");
    assert_eq!(
        output.status.code(),
        Some(2),
        "missing arguments are a usage error"
    );
    let zero_release = [
        "hold",
        "release",
        "--family",
        "f",
        "--capability",
        "c",
        "--hold",
        "h",
        "--units",
        "0",
    ];
    let output = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(zero_release)
        .output()
        .expect("runs");
    assert_eq!(
        output.status.code(),
        Some(2),
        "an invalid command is refused before any call"
    );
    assert!(String::from_utf8_lossy(&output.stderr).contains("greater than zero"));
    for share in ["--hot-share", "--denied-share"] {
        let output = Command::new(env!("CARGO_BIN_EXE_tally"))
            .args(["bench", share, "1.5", "--endpoints", "127.0.0.1:9"])
            .output()
            .expect("runs");
        assert_eq!(
            output.status.code(),
            Some(2),
            "{share} 1.5 is a usage error"
        );
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("a share of calls within 0..=1"),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
