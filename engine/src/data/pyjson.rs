//! `tojson` exactly as Hugging Face's chat-template environment defines it: Python's
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
//!
//! minijinja's built-in `tojson` writes compact JSON with HTML-safe escapes (`\u003c`), which
//! would render tool definitions differently from the text the target model was trained on.
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// How to format, mirroring the `json.dumps` keyword arguments HF passes through.
#[derive(Debug, Clone)]
pub struct DumpOptions {
    pub indent: Option<String>,
    pub ensure_ascii: bool,
    pub sort_keys: bool,
    pub item_separator: String,
    pub key_separator: String,
}

impl DumpOptions {
    /// Python's defaults: `", "` / `": "` without indent, `","` / `": "` with one.
    pub fn python(indent: Option<String>) -> Self {
        let item_separator = if indent.is_some() { "," } else { ", " }.to_string();
        DumpOptions {
            indent,
            ensure_ascii: false,
            sort_keys: false,
            item_separator,
            key_separator: ": ".to_string(),
        }
    }
}

/// The template filter: `x | tojson`, `x | tojson(indent=2)`, `tojson(x, sort_keys=true)`.
pub fn tojson_filter(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.is_integer() => Some(" ".repeat(usize::try_from(v)?)),
        Some(v) => Some(v.as_str().map(str::to_string).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidOperation,
                "tojson: indent must be an int or a string",
            )
        })?),
    };
    let mut opts = DumpOptions::python(indent);
    if let Some(flag) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        opts.ensure_ascii = flag;
    }
    if let Some(flag) = kwargs.get::<Option<bool>>("sort_keys")? {
        opts.sort_keys = flag;
    }
    if let Some(seps) = kwargs.get::<Option<Vec<String>>>("separators")? {
        let [item, key]: [String; 2] = seps.try_into().map_err(|_| {
            Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair",
            )
        })?;
        opts.item_separator = item;
        opts.key_separator = key;
    }
    kwargs.assert_all_used()?;
    let mut out = String::new();
    dump(value, &opts, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

/// Writes `value` as `json.dumps` would.
pub fn dump(
    value: &Value,
    opts: &DumpOptions,
    depth: usize,
    out: &mut String,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
        ValueKind::Number => out.push_str(&python_float_repr(f64::try_from(value.clone())?)),
        ValueKind::String => {
            write_string(value.as_str().unwrap_or_default(), opts.ensure_ascii, out)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, opts, depth, '[', ']', &items, |item, out| {
                dump(item, opts, depth + 1, out)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if opts.sort_keys {
                keys.sort();
            }
            write_container(out, opts, depth, '{', '}', &keys, |key, out| {
                match key.as_str() {
                    Some(s) => write_string(s, opts.ensure_ascii, out),
                    // Python turns int/bool/None keys into strings.
                    None => write_string(&key_string(key), opts.ensure_ascii, out),
                }
                out.push_str(&opts.key_separator);
                dump(&value.get_item(key)?, opts, depth + 1, out)
            })?;
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a value of type {kind} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

fn key_string(key: &Value) -> String {
    match key.kind() {
        ValueKind::None => "null".to_string(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_string(),
        _ => key.to_string(),
    }
}

fn write_container<F>(
    out: &mut String,
    opts: &DumpOptions,
    depth: usize,
    open: char,
    close: char,
    items: &[Value],
    mut write_item: F,
) -> Result<(), Error>
where
    F: FnMut(&Value, &mut String) -> Result<(), Error>,
{
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&opts.item_separator);
        }
        if let Some(indent) = &opts.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth + 1));
        }
        write_item(item, out)?;
    }
    if let Some(indent) = &opts.indent {
        out.push('\n');
        out.push_str(&indent.repeat(depth));
    }
    out.push(close);
    Ok(())
}

fn write_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: shortest round-trip digits, positional for decimal exponents in
/// [-4, 16), otherwise `1e-05` style; `NaN`/`Infinity` as `json.dumps` writes them.
pub fn python_float_repr(v: f64) -> String {
    if v.is_nan() {
        return "NaN".to_string();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    // `{:e}` gives the shortest round-trip digits, e.g. "-1.25e-7".
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` always has an exponent");
    let exp: i32 = exp.parse().expect("`{:e}` exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let point = exp + 1; // digits[..point] are the integer part
    let body = if !(-3..=16).contains(&point) {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{first}{frac}e{esign}{:02}", exp.abs())
    } else if point <= 0 {
        format!("0.{}{digits}", "0".repeat((-point) as usize))
    } else if point as usize >= digits.len() {
        format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
    } else {
        let (int, frac) = digits.split_at(point as usize);
        format!("{int}.{frac}")
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(json: &str, indent: Option<&str>) -> String {
        let value: Value = serde_json::from_str(json).unwrap();
        let mut out = String::new();
        dump(
            &value,
            &DumpOptions::python(indent.map(str::to_string)),
            0,
            &mut out,
        )
        .unwrap();
        out
    }

    #[test]
    fn float_repr_matches_python() {
        // Expected strings are Python 3's repr() of the same floats.
        let cases = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (123456.789, "123456.789"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.2345e22, "1.2345e+22"),
            (-2.5e-300, "-2.5e-300"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ];
        for (v, expected) in cases {
            assert_eq!(python_float_repr(v), expected, "{v:e}");
        }
    }

    #[test]
    fn dumps_like_python_default_separators_and_key_order() {
        // json.dumps({"b": 1, "a": [1.0, None, True, "x\"y\n"], "é": {}}, ensure_ascii=False)
        assert_eq!(
            dumps(
                r#"{"b": 1, "a": [1.0, null, true, "x\"y\n"], "é": {}}"#,
                None
            ),
            r#"{"b": 1, "a": [1.0, null, true, "x\"y\n"], "é": {}}"#
        );
    }

    #[test]
    fn dumps_with_indent_like_python() {
        // json.dumps({"a": [1, {"b": []}]}, indent=2)
        assert_eq!(
            dumps(r#"{"a": [1, {"b": []}]}"#, Some("  ")),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": []\n    }\n  ]\n}"
        );
    }

    #[test]
    fn escapes_control_and_optionally_non_ascii() {
        let mut out = String::new();
        write_string("<a>\u{1}é😀", false, &mut out);
        assert_eq!(out, "\"<a>\\u0001é😀\"");
        out.clear();
        write_string("é😀", true, &mut out);
        assert_eq!(out, "\"\\u00e9\\ud83d\\ude00\"");
    }
}
