//! Path templates in the config, expanded without touching the environment directly: the
//! caller passes the lookups, so this stays pure and testable.
//!
//! Supported: a leading `~/` (home), `${VAR}`, `${VAR:-default}` (default used when VAR is
//! unset or empty; defaults may nest further templates) and `{run_dir}`.

/// What a template may refer to.
pub struct PathContext<'a> {
    pub home: Option<&'a str>,
    pub run_dir: Option<&'a str>,
    pub env: &'a dyn Fn(&str) -> Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathTemplateError {
    #[error("environment variable {0} is not set and the template gives no default (write ${{{0}:-default}})")]
    UnsetVariable(String),
    #[error("'~' needs a home directory, and none is known")]
    NoHome,
    #[error("{{run_dir}} used where no run directory is known")]
    NoRunDir,
    #[error("unterminated '${{' in '{0}'")]
    Unterminated(String),
}

pub fn expand_path(template: &str, ctx: &PathContext<'_>) -> Result<String, PathTemplateError> {
    let expanded = expand_vars(template, ctx)?;
    if expanded == "~" || expanded.starts_with("~/") {
        let home = ctx.home.ok_or(PathTemplateError::NoHome)?;
        return Ok(format!("{}{}", home.trim_end_matches('/'), &expanded[1..]));
    }
    Ok(expanded)
}

fn expand_vars(template: &str, ctx: &PathContext<'_>) -> Result<String, PathTemplateError> {
    let mut out = String::new();
    let mut rest = template;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("${") {
            let end = matching_brace(after)
                .ok_or_else(|| PathTemplateError::Unterminated(template.into()))?;
            let body = &after[..end];
            let (name, default) = match body.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (body, None),
            };
            match ((ctx.env)(name).filter(|v| !v.is_empty()), default) {
                (Some(value), _) => out.push_str(&value),
                (None, Some(d)) => out.push_str(&expand_path(d, ctx)?),
                (None, None) => return Err(PathTemplateError::UnsetVariable(name.into())),
            }
            rest = &after[end + 1..];
        } else if let Some(after) = rest.strip_prefix("{run_dir}") {
            out.push_str(ctx.run_dir.ok_or(PathTemplateError::NoRunDir)?);
            rest = after;
        } else {
            let c = rest.chars().next().unwrap_or_default();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    Ok(out)
}

/// Index of the `}` closing a `${` whose body starts at `s[0]`, skipping nested `${…}`.
fn matching_brace(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'$' if bytes.get(i + 1) == Some(&b'{') => {
                depth += 1;
                i += 1;
            }
            b'}' if depth == 0 => return Some(i),
            b'}' => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::daemon_sections::default_caches;

    fn ctx<'a>(env: &'a dyn Fn(&str) -> Option<String>) -> PathContext<'a> {
        PathContext {
            home: Some("/home/op"),
            run_dir: Some("/srv/runs/r1"),
            env,
        }
    }

    #[test]
    fn default_cache_locations_follow_their_owners() {
        let user = |k: &str| (k == "USER").then(|| "op".to_string());
        let paths: Vec<String> = default_caches()
            .iter()
            .map(|c| expand_path(&c.path, &ctx(&user)).unwrap())
            .collect();
        assert_eq!(
            paths,
            [
                "/tmp/torchinductor_op",
                "/home/op/.triton/cache",
                "/home/op/.nv/ComputeCache",
                "/srv/runs/r1/warmup.json"
            ]
        );
        let overridden = |k: &str| match k {
            "TORCHINDUCTOR_CACHE_DIR" => Some("/fast/inductor".to_string()),
            "TRITON_CACHE_DIR" => Some("/fast/triton".to_string()),
            "TMPDIR" => Some("/scratch".to_string()),
            _ => None,
        };
        assert_eq!(
            expand_path(&default_caches()[0].path, &ctx(&overridden)).unwrap(),
            "/fast/inductor"
        );
        assert_eq!(
            expand_path(&default_caches()[1].path, &ctx(&overridden)).unwrap(),
            "/fast/triton"
        );
    }

    #[test]
    fn errors_name_the_missing_piece() {
        let none = |_: &str| None;
        assert_eq!(
            expand_path(
                "${TORCHINDUCTOR_CACHE_DIR:-/tmp/torchinductor_${USER}}",
                &ctx(&none)
            ),
            Err(PathTemplateError::UnsetVariable("USER".into()))
        );
        assert_eq!(
            expand_path("${HOME", &ctx(&none)),
            Err(PathTemplateError::Unterminated("${HOME".into()))
        );
        let no_home = PathContext {
            home: None,
            run_dir: None,
            env: &none,
        };
        assert_eq!(expand_path("~/x", &no_home), Err(PathTemplateError::NoHome));
        assert_eq!(
            expand_path("{run_dir}/w", &no_home),
            Err(PathTemplateError::NoRunDir)
        );
        assert_eq!(
            expand_path("/plain/ü/path", &no_home).unwrap(),
            "/plain/ü/path"
        );
    }
}
