//! `builtin:first-select`: Sedna's deploy rule. Deploy the first evaluated model, if there is
//! one; the deployed model is not compared. Config: none (`{}`).

use perennial_guest::{Choice, Model, Selector};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {}

pub struct FirstSelect;

impl Selector for FirstSelect {
    fn configure(config: &str) -> Result<Self, String> {
        let Config {} = perennial_guest::parse_config(config)?;
        Ok(FirstSelect)
    }

    fn select(&mut self, _deployed: Option<&Model>, candidates: &[Model]) -> Choice {
        match candidates.first() {
            Some(model) => Choice::deploy(0, format!("first evaluated model {}", model.url)),
            None => Choice::keep("no evaluated model"),
        }
    }
}

perennial_guest::export_selector!(FirstSelect);

#[cfg(test)]
mod tests {
    use super::*;

    fn model(url: &str) -> Model {
        Model { url: url.into(), format: "pkl".into(), ..Model::default() }
    }

    #[test]
    fn deploys_the_first_candidate_or_nothing() {
        let mut s = FirstSelect::configure("{}").unwrap();
        let deployed = model("/out/deploy/index.pkl");
        assert_eq!(s.select(Some(&deployed), &[model("/a"), model("/b")]).deploy, Some(0));
        assert_eq!(s.select(None, &[model("/a")]).deploy, Some(0));
        let none = s.select(Some(&deployed), &[]);
        assert_eq!(none, Choice::keep("no evaluated model"));
    }

    #[test]
    fn takes_no_config() {
        assert!(FirstSelect::configure("").is_ok());
        let err = FirstSelect::configure(r#"{"metric": "x"}"#).err().unwrap();
        assert!(err.contains("metric: unknown field"), "{err}");
    }
}
