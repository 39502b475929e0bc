//! Stamps the git commit into the build (`ringway --version`,
//! `ringway_build_info`): `RINGWAY_COMMIT` if set (a package build from
//! a tarball), else `git rev-parse`, else `unknown`.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=RINGWAY_COMMIT");
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    // Rebuild when HEAD moves: HEAD itself, the branch it names and
    // packed-refs (a worktree's HEAD and the refs live in git dirs). Only
    // this branch's ref, not all of refs/heads: other worktrees' commits
    // would otherwise rebuild everything above this crate.
    let branch_ref = git(&["symbolic-ref", "-q", "HEAD"])
        .and_then(|name| git(&["rev-parse", "--git-path", &name]));
    for path in [
        git(&["rev-parse", "--git-path", "HEAD"]),
        branch_ref,
        git(&["rev-parse", "--git-path", "packed-refs"]),
    ]
    .into_iter()
    .flatten()
    // A path that does not exist (no packed-refs in a fresh `git init`)
    // would make cargo run this script, and rebuild every crate above,
    // on every build.
    .filter(|path| std::path::Path::new(path).exists())
    {
        println!("cargo:rerun-if-changed={path}");
    }
    let commit = std::env::var("RINGWAY_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=RINGWAY_COMMIT={commit}");
}
