//! [`resolve`]: flags and environment → [`NodeLaunch`], by the rules of the module page.
use super::{
    hostlist, parse_host, parse_port, parse_rendezvous, EnvMap, LaunchError, LaunchFlags,
    LaunchSource, NodeLaunch, Origin, Rendezvous,
};

/// One statement of a fact, with where it came from.
#[derive(Debug, Clone)]
struct Stated<T> {
    value: T,
    origin: Origin,
}

/// The port SLURM jobs derive when nothing names one: 15000 + the job id's last four digits.
const SLURM_PORT_BASE: u32 = 15_000;

/// Resolves this node's launch from the `start` flags and the environment (see the module
/// page for the sources, their order and the refusals).
pub fn resolve(flags: &LaunchFlags, env: &EnvMap) -> Result<NodeLaunch, LaunchError> {
    let world_counts_nodes = world_counts_nodes(env)?;
    check_slurm_tasks(env)?;
    let mut counts = vec![flag(flags.nnodes, "--nnodes")];
    counts.push(env_number(env, "NNODES", 1)?);
    counts.push(env_number(env, "SLURM_NNODES", 1)?);
    let mut ranks = vec![flag(flags.node_rank, "--node-rank")];
    ranks.push(env_number(env, "NODE_RANK", 0)?);
    ranks.push(env_number(env, "SLURM_NODEID", 0)?);
    if world_counts_nodes {
        counts.push(env_number(env, "WORLD_SIZE", 1)?);
        ranks.push(env_number(env, "RANK", 0)?);
    }
    if let Some(Stated { value: 0, origin }) = counts[0].clone() {
        return Err(LaunchError::Invalid {
            origin: origin.to_string(),
            problem: "expected at least 1 node".into(),
        });
    }
    let nnodes = agree("the node count", counts)?;
    if nnodes.is_none() && !world_counts_nodes {
        if let Some(world) = env_number(env, "WORLD_SIZE", 1)? {
            if world.value > 1 {
                return Err(LaunchError::AmbiguousWorldSize {
                    world_size: world.value,
                });
            }
        }
    }
    let rank = agree("the node rank", ranks)?;
    let (nnodes, nnodes_origin) = nnodes.map_or((1, Origin::Default), |s| (s.value, s.origin));
    let (node_rank, rank_origin) = match rank {
        Some(s) => (s.value, s.origin),
        None if nnodes > 1 => {
            return Err(LaunchError::MissingNodeRank {
                nnodes: nnodes_origin,
                value: nnodes,
            })
        }
        None => (0, Origin::Default),
    };
    if node_rank >= nnodes {
        return Err(LaunchError::RankOutOfRange {
            node_rank: rank_origin,
            nnodes: nnodes_origin,
            nnodes_value: nnodes,
        });
    }
    let flag_rendezvous = flags
        .rendezvous
        .as_deref()
        .map(|text| {
            parse_rendezvous(text).map_err(|problem| LaunchError::Invalid {
                origin: format!("--rendezvous {text}"),
                problem,
            })
        })
        .transpose()?;
    let mut source = LaunchSource {
        nnodes: nnodes_origin,
        node_rank: rank_origin,
        rendezvous_host: None,
        rendezvous_port: None,
    };
    // One node meets no one: a rendezvous it was given is checked above and not kept.
    let rendezvous = if nnodes > 1 {
        let (r, host, port) = rendezvous(flags, flag_rendezvous, env, nnodes, node_rank)?;
        source.rendezvous_host = Some(host);
        source.rendezvous_port = Some(port);
        Some(r)
    } else {
        None
    };
    Ok(NodeLaunch {
        nnodes,
        node_rank,
        rendezvous,
        source,
    })
}

fn flag(value: Option<u32>, name: &str) -> Option<Stated<u32>> {
    value.map(|value| Stated {
        value,
        origin: Origin::Flag(format!("{name} {value}")),
    })
}

/// A variable's value, trimmed; an empty one counts as unset (scripts export empty values).
fn env_text<'a>(env: &'a EnvMap, var: &str) -> Option<&'a str> {
    env.get(var).map(|v| v.trim()).filter(|v| !v.is_empty())
}

fn env_number(env: &EnvMap, var: &str, min: u32) -> Result<Option<Stated<u32>>, LaunchError> {
    let Some(text) = env_text(env, var) else {
        return Ok(None);
    };
    let origin = Origin::Env(format!("{var}={text}"));
    match text.parse::<u32>() {
        Ok(value) if value >= min => Ok(Some(Stated { value, origin })),
        _ => Err(LaunchError::Invalid {
            origin: origin.to_string(),
            problem: format!("expected a whole number, at least {min}"),
        }),
    }
}

/// Whether torchrun's `WORLD_SIZE`/`RANK` count nodes: only with `LOCAL_WORLD_SIZE=1`.
fn world_counts_nodes(env: &EnvMap) -> Result<bool, LaunchError> {
    match env_number(env, "LOCAL_WORLD_SIZE", 1)? {
        None => Ok(false),
        Some(s) if s.value == 1 => Ok(true),
        Some(s) => Err(LaunchError::SeveralProcessesPerNode {
            local_world_size: s.value,
        }),
    }
}

fn check_slurm_tasks(env: &EnvMap) -> Result<(), LaunchError> {
    let (Some(tasks), Some(nodes)) = (
        env_number(env, "SLURM_NTASKS", 1)?,
        env_number(env, "SLURM_NNODES", 1)?,
    ) else {
        return Ok(());
    };
    if tasks.value == nodes.value {
        return Ok(());
    }
    Err(LaunchError::SlurmTaskCount {
        ntasks: tasks.value,
        nnodes: nodes.value,
    })
}

/// The first statement, once every other agrees with it.
fn agree<T: PartialEq + Clone>(
    what: &'static str,
    said: Vec<Option<Stated<T>>>,
) -> Result<Option<Stated<T>>, LaunchError> {
    let said: Vec<Stated<T>> = said.into_iter().flatten().collect();
    let Some(first) = said.first() else {
        return Ok(None);
    };
    if let Some(other) = said.iter().find(|s| s.value != first.value) {
        return Err(LaunchError::Disagree {
            what,
            first: first.origin.clone(),
            second: other.origin.clone(),
        });
    }
    Ok(Some(first.clone()))
}

/// The rendezvous of a multi-node launch, with the origins of its host and its port.
fn rendezvous(
    flags: &LaunchFlags,
    flag_rendezvous: Option<Rendezvous>,
    env: &EnvMap,
    nnodes: u32,
    node_rank: u32,
) -> Result<(Rendezvous, Origin, Origin), LaunchError> {
    let flag_origin = || {
        Origin::Flag(format!(
            "--rendezvous {}",
            flags.rendezvous.as_deref().unwrap_or("")
        ))
    };
    let mut hosts = vec![flag_rendezvous.as_ref().map(|r| Stated {
        value: r.host.clone(),
        origin: flag_origin(),
    })];
    let mut ports = vec![flag_rendezvous.as_ref().map(|r| Stated {
        value: r.port,
        origin: flag_origin(),
    })];
    if let Some(text) = env_text(env, "MASTER_ADDR") {
        let origin = Origin::Env(format!("MASTER_ADDR={text}"));
        let value = parse_host(text).map_err(|problem| LaunchError::Invalid {
            origin: origin.to_string(),
            problem,
        })?;
        hosts.push(Some(Stated { value, origin }));
    }
    if let Some(text) = env_text(env, "MASTER_PORT") {
        let origin = Origin::Env(format!("MASTER_PORT={text}"));
        let value = parse_port(text).map_err(|problem| LaunchError::Invalid {
            origin: origin.to_string(),
            problem,
        })?;
        ports.push(Some(Stated { value, origin }));
    }
    let host = match agree("the rendezvous host", hosts)? {
        Some(s) => Some(s),
        None => slurm_host(env)?,
    };
    let port = match agree("the rendezvous port", ports)? {
        Some(s) => Some(s),
        None => slurm_port(env)?,
    };
    match (host, port) {
        (Some(h), Some(p)) => Ok((
            Rendezvous {
                host: h.value,
                port: p.value,
            },
            h.origin,
            p.origin,
        )),
        (None, None) => Err(LaunchError::NoRendezvous { nnodes, node_rank }),
        (Some(h), None) => Err(LaunchError::HalfRendezvous {
            have: h.origin,
            have_what: "host",
            missing: "port",
            fix: "set MASTER_PORT, or pass --rendezvous HOST:PORT",
        }),
        (None, Some(p)) => Err(LaunchError::HalfRendezvous {
            have: p.origin,
            have_what: "port",
            missing: "host",
            fix: "set MASTER_ADDR to node 0's address, or pass --rendezvous HOST:PORT",
        }),
    }
}

/// Under SLURM, node 0 runs on the first host of the job's node list.
fn slurm_host(env: &EnvMap) -> Result<Option<Stated<String>>, LaunchError> {
    let Some((var, list)) = ["SLURM_JOB_NODELIST", "SLURM_NODELIST"]
        .into_iter()
        .find_map(|var| env_text(env, var).map(|list| (var, list)))
    else {
        return Ok(None);
    };
    let origin = format!("the first host of {var}={list}");
    let host = hostlist::first_host(list).map_err(|e| LaunchError::Invalid {
        origin: format!("{var}={list}"),
        problem: format!("{e}; or set MASTER_ADDR to node 0's address"),
    })?;
    Ok(Some(Stated {
        value: host,
        origin: Origin::Derived(origin),
    }))
}

fn slurm_port(env: &EnvMap) -> Result<Option<Stated<u16>>, LaunchError> {
    let Some(job) = env_text(env, "SLURM_JOB_ID") else {
        return Ok(None);
    };
    // Array jobs and heterogeneous jobs write ids like `1234_7` or `1234+0`: the leading
    // digits are the job's.
    let digits: String = job.chars().take_while(char::is_ascii_digit).collect();
    let Ok(id) = digits.parse::<u64>() else {
        return Err(LaunchError::Invalid {
            origin: format!("SLURM_JOB_ID={job}"),
            problem: "expected a job number; or set MASTER_PORT".into(),
        });
    };
    let port = SLURM_PORT_BASE + (id % 10_000) as u32;
    Ok(Some(Stated {
        value: port as u16,
        origin: Origin::Derived(format!("port {port} from SLURM_JOB_ID={job}")),
    }))
}

#[cfg(test)]
#[path = "resolve_tests.rs"]
mod tests;
