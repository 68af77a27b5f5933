//! SLURM's hostlist syntax (`SLURM_JOB_NODELIST`): `node[01-04,07],gpu5`.
//!
//! A list is hostnames or bracketed ranges separated by `,` (or whitespace) outside brackets.
//! A bracket holds comma-separated numbers or `lo-hi` ranges; a number keeps the width it is
//! written with, so `node[08-10]` is `node08 node09 node10`, as `scontrol show hostnames`
//! prints it. Several brackets in one name (`rack[1-2]-n[1-3]`) expand leftmost-outermost.
//! The BlueGene prism form (`bgl[123x456]`) is refused: no cluster this runs on uses it.
//!
//! No crate for this is in the workspace's lock, so this is a small parser of the documented
//! syntax; it only has to name the rendezvous host (the first one) and count the nodes.
use std::fmt;

/// A list larger than this is refused rather than expanded (a typo like `n[0-99999999]`).
pub const MAX_HOSTS: usize = 65_536;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct HostlistError {
    pub list: String,
    pub problem: String,
}

impl fmt::Display for HostlistError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot read the SLURM hostlist {:?}: {} (expected names like node[01-04,07],gpu5)",
            self.list, self.problem
        )
    }
}

/// Every host of `list`, in the order written.
pub fn expand(list: &str) -> Result<Vec<String>, HostlistError> {
    let fail = |problem: String| HostlistError {
        list: list.to_string(),
        problem,
    };
    let mut hosts = Vec::new();
    for name in split_names(list).map_err(&fail)? {
        let parts = parse_name(name).map_err(&fail)?;
        let mut expanded = vec![String::new()];
        for part in parts {
            let mut next = Vec::with_capacity(expanded.len() * part.len());
            for prefix in &expanded {
                for piece in &part {
                    next.push(format!("{prefix}{piece}"));
                }
            }
            if hosts.len() + next.len() > MAX_HOSTS {
                return Err(fail(format!("more than {MAX_HOSTS} hosts")));
            }
            expanded = next;
        }
        hosts.extend(expanded);
    }
    if hosts.is_empty() {
        return Err(fail("it names no host".into()));
    }
    Ok(hosts)
}

/// The first host of `list`: where node 0 runs under SLURM, hence the rendezvous host.
pub fn first_host(list: &str) -> Result<String, HostlistError> {
    Ok(expand(list)?.swap_remove(0))
}

/// The top-level names: split on `,` and whitespace outside brackets.
fn split_names(list: &str) -> Result<Vec<&str>, String> {
    let mut names = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(format!("a bracket inside a bracket at byte {i}")),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(format!("a ']' with no '[' before it at byte {i}")),
            ',' | ' ' | '\t' | '\n' if depth == 0 => {
                names.push(&list[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("a '[' that is never closed".into());
    }
    names.push(&list[start..]);
    Ok(names.into_iter().filter(|n| !n.is_empty()).collect())
}

/// One name as a sequence of alternatives: literal text is one alternative, a bracket many.
fn parse_name(name: &str) -> Result<Vec<Vec<String>>, String> {
    let mut parts = Vec::new();
    let mut rest = name;
    while let Some(open) = rest.find('[') {
        if open > 0 {
            parts.push(vec![rest[..open].to_string()]);
        }
        let close = rest[open..]
            .find(']')
            .map(|c| open + c)
            .ok_or_else(|| format!("{name:?} has a '[' that is never closed"))?;
        parts.push(parse_bracket(&rest[open + 1..close])?);
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        parts.push(vec![rest.to_string()]);
    }
    Ok(parts)
}

/// `01-04,07` → `01 02 03 04 07`, each number as wide as its range's lower bound is written.
fn parse_bracket(inner: &str) -> Result<Vec<String>, String> {
    if inner.contains('x') {
        return Err(format!(
            "[{inner}] is the BlueGene prism form, which is not supported: list the hosts"
        ));
    }
    let mut out = Vec::new();
    for item in inner.split(',') {
        let (lo, hi) = item.split_once('-').unwrap_or((item, item));
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(lo) || !digits(hi) {
            return Err(format!(
                "[{inner}] holds {item:?}, which is neither a number nor a range lo-hi"
            ));
        }
        let parse = |s: &str| {
            s.parse::<u64>()
                .map_err(|_| format!("{s} in [{inner}] is too large"))
        };
        let (a, b) = (parse(lo)?, parse(hi)?);
        if a > b {
            return Err(format!("the range {item} in [{inner}] runs backwards"));
        }
        if (b - a) as usize >= MAX_HOSTS || out.len() + (b - a) as usize >= MAX_HOSTS {
            return Err(format!("more than {MAX_HOSTS} hosts"));
        }
        let width = lo.len();
        out.extend((a..=b).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_keep_their_zero_padding_and_their_written_order() {
        assert_eq!(
            expand("node[01-04,07],gpu5").unwrap(),
            ["node01", "node02", "node03", "node04", "node07", "gpu5"]
        );
        assert_eq!(
            expand("n[08-10]").unwrap(),
            ["n08", "n09", "n10"],
            "the width is the lower bound's"
        );
        assert_eq!(expand("n[8-10]").unwrap(), ["n8", "n9", "n10"]);
        assert_eq!(
            expand("n[7,3]").unwrap(),
            ["n7", "n3"],
            "written order, not sorted"
        );
        assert_eq!(first_host("n[098-100]").unwrap(), "n098");
    }

    #[test]
    fn plain_names_suffixes_several_brackets_and_whitespace() {
        assert_eq!(first_host("login1").unwrap(), "login1");
        assert_eq!(
            expand("gpu-[1-2]-ib").unwrap(),
            ["gpu-1-ib", "gpu-2-ib"],
            "text after a bracket"
        );
        assert_eq!(
            expand("r[1-2]-n[1-2]").unwrap(),
            ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]
        );
        assert_eq!(expand("a1 b2,,c3").unwrap(), ["a1", "b2", "c3"]);
        assert_eq!(
            first_host("node[3-4],node1").unwrap(),
            "node3",
            "SLURM's first listed host is node 0's"
        );
    }

    #[test]
    fn malformed_lists_are_refused_naming_the_problem() {
        for (list, says) in [
            ("", "names no host"),
            ("node[1-2", "never closed"),
            ("node1-2]", "no '['"),
            ("node[[1]]", "inside a bracket"),
            ("node[a-b]", "neither a number"),
            ("node[4-2]", "backwards"),
            ("node[]", "neither a number"),
            ("bgl[123x456]", "BlueGene"),
            ("n[0-99999999]", "more than"),
        ] {
            let err = expand(list).unwrap_err().to_string();
            assert!(err.contains(says), "{list:?}: {err}");
            assert!(
                err.contains("node[01-04,07]"),
                "says what is expected: {err}"
            );
        }
    }
}
