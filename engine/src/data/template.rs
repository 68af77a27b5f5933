//! A model's chat template, rendered the way Hugging Face `apply_chat_template` renders it:
//! Jinja with `trim_blocks` + `lstrip_blocks`, loop controls, the `raise_exception` and
//! `strftime_now` globals, Python's `json.dumps` as `tojson`, and Python string/dict methods.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use minijinja::{Environment, Error, ErrorKind, Value};

use super::error::DataError;
use super::pyjson::tojson_filter;

const TEMPLATE_NAME: &str = "chat_template";

pub struct ChatTemplate {
    env: Environment<'static>,
    origin: PathBuf,
    /// `bos_token`, `eos_token`, ... as HF passes them into every render.
    special_tokens: BTreeMap<String, Value>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("special_tokens", &self.special_tokens)
            .finish_non_exhaustive()
    }
}

/// What one render receives besides the messages.
#[derive(Debug, Clone, Default)]
pub struct RenderArgs {
    /// Tool definitions (`tools` in HF), when the row has any.
    pub tools: Option<Value>,
    pub add_generation_prompt: bool,
    /// Extra template variables, e.g. `enable_thinking` (HF `**kwargs`).
    pub extra: BTreeMap<String, Value>,
}

impl ChatTemplate {
    /// Compiles `source`; `origin` is the file it came from, named in every error.
    pub fn compile(source: String, origin: PathBuf) -> Result<Self, DataError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson_filter);
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|e| DataError::BadTemplate {
                path: origin.clone(),
                reason: describe(&e),
            })?;
        Ok(ChatTemplate {
            env,
            origin,
            special_tokens: BTreeMap::new(),
        })
    }

    pub fn with_special_tokens(mut self, tokens: BTreeMap<String, String>) -> Self {
        self.special_tokens = tokens
            .into_iter()
            .map(|(k, v)| (k, Value::from(v)))
            .collect();
        self
    }

    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// Renders a conversation (a sequence of message maps). `Err` carries the template's own
    /// message, e.g. what `raise_exception` was called with.
    pub fn render(&self, messages: &Value, args: &RenderArgs) -> Result<String, String> {
        let mut ctx: BTreeMap<String, Value> = self.special_tokens.clone();
        ctx.extend(args.extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        ctx.insert("messages".into(), messages.clone());
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(args.add_generation_prompt),
        );
        if let Some(tools) = &args.tools {
            ctx.insert("tools".into(), tools.clone());
        }
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| describe(&e))?;
        template.render(Value::from(ctx)).map_err(|e| describe(&e))
    }
}

/// One line: the error, its detail, and where in the template it happened.
fn describe(e: &Error) -> String {
    let mut text = match (e.kind(), e.detail()) {
        (ErrorKind::InvalidOperation, Some(detail)) => detail.to_string(),
        _ => e.to_string(),
    };
    if let Some(line) = e.line() {
        if !text.contains(" line ") {
            text.push_str(&format!(" (template line {line})"));
        }
    }
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        text.push_str(&format!(": {inner}"));
        source = inner.source();
    }
    text
}

/// HF's global: templates call it to reject a conversation they cannot render.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// HF's global: the local time formatted with a Python `strftime` pattern.
fn strftime_now(format: String) -> Result<Value, Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(&format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: unsupported format {format:?}"),
        ));
    }
    Ok(Value::from(
        chrono::Local::now()
            .format_with_items(items.into_iter())
            .to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, messages: &str, extra: &[(&str, Value)]) -> Result<String, String> {
        let t = ChatTemplate::compile(source.to_string(), "t.jinja".into()).unwrap();
        let args = RenderArgs {
            extra: extra
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            ..Default::default()
        };
        t.render(&serde_json::from_str(messages).unwrap(), &args)
    }

    #[test]
    fn trims_blocks_like_hf() {
        let src = "{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content }}]\n  {% endif %}\n{% endfor %}\n";
        let out = render(src, r#"[{"role":"user","content":"a"},{"role":"x"}]"#, &[]).unwrap();
        assert_eq!(out, "[a]\n");
    }

    #[test]
    fn python_methods_namespace_and_loop_work() {
        let src = "{%- set ns = namespace(n=0) -%}\
            {%- for m in messages[::-1] -%}{%- set ns.n = ns.n + loop.index0 -%}{%- endfor -%}\
            {{ ns.n }}|{{ messages[0].content.split('</think>')[-1].lstrip('\\n').strip() }}\
            |{{ messages[0].content.startswith('<think>') }}\
            {%- for k, v in messages[0].items() %}|{{ k }}{% endfor %}";
        let out = render(
            src,
            r#"[{"role":"a","content":"<think>x</think>\n y "},{"role":"b"},{"role":"c"}]"#,
            &[],
        )
        .unwrap();
        // Booleans print as Python does (`True`), like Jinja2.
        assert_eq!(out, "3|y|True|role|content");
    }

    #[test]
    fn raise_exception_becomes_the_error_message() {
        let src = "{{ raise_exception('No user query found in messages.') }}";
        let err = render(src, "[]", &[]).unwrap_err();
        assert!(err.starts_with("No user query found in messages."), "{err}");
    }

    #[test]
    fn tojson_is_python_json_dumps_and_keeps_key_order() {
        let src = "{{ messages[0] | tojson }}";
        let out = render(src, r#"[{"z":1,"a":"<b>"}]"#, &[]).unwrap();
        assert_eq!(out, r#"{"z": 1, "a": "<b>"}"#);
    }

    #[test]
    fn extra_kwargs_and_undefined_tests_behave_like_jinja() {
        let src = "{% if enable_thinking is defined and enable_thinking is false %}off{% else %}on{% endif %}";
        assert_eq!(render(src, "[]", &[]).unwrap(), "on");
        let off = [("enable_thinking", Value::from(false))];
        assert_eq!(render(src, "[]", &off).unwrap(), "off");
    }

    #[test]
    fn syntax_errors_name_the_file() {
        let err = ChatTemplate::compile("{% if %}".into(), "model/tpl.jinja".into()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("model/tpl.jinja") && text.contains("bad chat template"),
            "{text}"
        );
    }

    #[test]
    fn strftime_now_formats_and_rejects_bad_patterns() {
        let year = render("{{ strftime_now('%Y') }}", "[]", &[]).unwrap();
        assert_eq!(year.len(), 4);
        assert!(render("{{ strftime_now('%Q') }}", "[]", &[]).is_err());
    }
}
