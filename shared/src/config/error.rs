//! Config errors that name the key path, what was expected and what was found.
use std::fmt;

/// Everything wrong with one config file (validation reports all problems at once).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct ConfigError {
    /// The file path, or `<embedded default>`.
    pub origin: String,
    pub issues: Vec<ConfigIssue>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.issues.as_slice() {
            [one] => write!(f, "{}: {one}", self.origin),
            many => {
                write!(f, "{}: {} problems", self.origin, many.len())?;
                for issue in many {
                    write!(f, "\n  - {issue}")?;
                }
                Ok(())
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ConfigIssue {
    /// Dotted key path, e.g. `training.num_anchors` or `telemetry.caches[1].path`; empty for a
    /// syntax error.
    pub key: String,
    /// 1-based line of the key in the file, when it is in the file.
    pub line: Option<usize>,
    pub problem: Problem,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Problem {
    Syntax {
        column: usize,
        message: String,
    },
    UnknownKey {
        suggestion: Option<String>,
    },
    Missing {
        expected: String,
    },
    Invalid {
        expected: String,
        found: String,
        hint: Option<String>,
    },
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Problem::Syntax { column, message } = &self.problem {
            return write!(
                f,
                "TOML syntax error at line {}, column {column}: {message}",
                self.line.unwrap_or(1)
            );
        }
        write!(f, "{}", self.key)?;
        if let Some(line) = self.line {
            write!(f, " (line {line})")?;
        }
        match &self.problem {
            Problem::UnknownKey {
                suggestion: Some(s),
            } => write!(f, ": unknown key; did you mean {s}?"),
            Problem::UnknownKey { suggestion: None } => write!(f, ": unknown key"),
            Problem::Missing { expected } => write!(f, ": missing; expected {expected}"),
            Problem::Invalid {
                expected,
                found,
                hint,
            } => {
                write!(f, ": expected {expected}, found {found}")?;
                if let Some(h) = hint {
                    write!(f, "; {h}")?;
                }
                Ok(())
            }
            Problem::Syntax { .. } => Ok(()),
        }
    }
}

impl ConfigIssue {
    pub fn invalid(
        key: impl Into<String>,
        expected: impl Into<String>,
        found: impl fmt::Display,
    ) -> Self {
        Self {
            key: key.into(),
            line: None,
            problem: Problem::Invalid {
                expected: expected.into(),
                found: found.to_string(),
                hint: None,
            },
        }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        if let Problem::Invalid { hint: h, .. } = &mut self.problem {
            *h = Some(hint.into());
        }
        self
    }
}

/// What a serde/toml error message says, in config words.
pub(crate) enum Translated {
    UnknownKey {
        key: String,
        allowed: Vec<String>,
    },
    Missing {
        key: String,
    },
    Invalid {
        expected: String,
        found: String,
        hint: Option<String>,
    },
}

/// Reads the messages serde's derive and our own deserializers produce.
pub(crate) fn translate_serde_message(message: &str) -> Translated {
    let message = message.trim();
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let (key, tail) = rest.split_once('`').unwrap_or((rest, ""));
        return Translated::UnknownKey {
            key: key.into(),
            allowed: backticked(tail),
        };
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        return Translated::Missing {
            key: rest.trim_end_matches('`').into(),
        };
    }
    if let Some(rest) = message.strip_prefix("unknown variant `") {
        let (found, tail) = rest.split_once('`').unwrap_or((rest, ""));
        let options: Vec<String> = backticked(tail)
            .iter()
            .map(|o| format!("\"{o}\""))
            .collect();
        return Translated::Invalid {
            expected: one_of(&options),
            found: format!("\"{found}\""),
            hint: None,
        };
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix) {
            if let Some((found, expected)) = rest.rsplit_once(", expected ") {
                return Translated::Invalid {
                    expected: humanize_expected(expected),
                    found: humanize_found(found),
                    hint: None,
                };
            }
        }
    }
    // Our own deserializers (devices, precision, byte sizes) say "expected X, found Y[; hint]".
    if let Some(rest) = message.strip_prefix("expected ") {
        if let Some((expected, found)) = rest.split_once(", found ") {
            let (found, hint) = match found.split_once("; ") {
                Some((f, h)) => (f.to_string(), Some(h.to_string())),
                None => (found.to_string(), None),
            };
            return Translated::Invalid {
                expected: expected.into(),
                found,
                hint,
            };
        }
    }
    Translated::Invalid {
        expected: "a valid value".into(),
        found: "something else".into(),
        hint: Some(message.into()),
    }
}

fn backticked(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

fn one_of(options: &[String]) -> String {
    match options {
        [] => "nothing".into(),
        [one] => one.clone(),
        [init @ .., last] => format!("one of {} or {last}", init.join(", ")),
    }
}

fn humanize_expected(expected: &str) -> String {
    match expected.trim() {
        "usize" | "u64" | "u32" | "u16" | "u8" => "a non-negative integer".into(),
        "i64" | "i32" | "isize" => "an integer".into(),
        "f64" | "f32" => "a number".into(),
        "a boolean" => "true or false".into(),
        "a sequence" => "an array".into(),
        "a string" | "a borrowed string" => "a string".into(),
        s if s.starts_with("struct ") || s == "a map" => "a table".into(),
        s if s.starts_with("option") => "a value".into(),
        other => other.into(),
    }
}

fn humanize_found(found: &str) -> String {
    let inner = |s: &str| s.trim_start_matches('`').trim_end_matches('`').to_string();
    if let Some(s) = found.strip_prefix("string ") {
        return format!("the string {s}");
    }
    for prefix in ["integer ", "floating point ", "boolean "] {
        if let Some(v) = found.strip_prefix(prefix) {
            return inner(v);
        }
    }
    match found {
        "sequence" => "an array".into(),
        "map" => "a table".into(),
        other => other.into(),
    }
}

/// Levenshtein distance, for "did you mean".
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The closest allowed key, if it is close enough to be a typo.
pub(crate) fn closest<'a>(
    key: &str,
    allowed: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let limit = (key.chars().count() / 3).max(2);
    allowed
        .into_iter()
        .map(|a| (edit_distance(key, a), a))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, a)| a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_get_suggestions() {
        assert_eq!(edit_distance("num_anchor", "num_anchors"), 1);
        assert_eq!(
            closest("num_anchor", ["epochs", "num_anchors"]),
            Some("num_anchors")
        );
        assert_eq!(closest("colour", ["epochs", "num_anchors"]), None);
    }
}
