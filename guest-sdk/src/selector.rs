use std::marker::PhantomData;

use crate::__private::selector::exports::perennial::policy::selector as wit;
use crate::__private::wit_types;
use crate::Metrics;

/// An evaluated (or deployed) model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Model {
    pub url: String,
    pub format: String,
    pub metrics: Metrics,
}

impl From<wit_types::Model> for Model {
    fn from(model: wit_types::Model) -> Self {
        Model { url: model.url, format: model.format, metrics: model.metrics.into() }
    }
}

/// A selector's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// Index into the candidates of the model to deploy; `None` keeps the deployed model.
    pub deploy: Option<usize>,
    /// Why, in a few words: shown on the job.
    pub reason: String,
}

impl Choice {
    /// Deploy `candidates[index]`.
    pub fn deploy(index: usize, reason: impl Into<String>) -> Self {
        Choice { deploy: Some(index), reason: reason.into() }
    }

    /// Deploy nothing; the deployed model stays.
    pub fn keep(reason: impl Into<String>) -> Self {
        Choice { deploy: None, reason: reason.into() }
    }
}

/// Chooses which evaluated model to deploy.
pub trait Selector: Sized + 'static {
    /// Builds the policy from the job's JSON config, or says what is wrong with it,
    /// naming the field.
    fn configure(config: &str) -> Result<Self, String>;

    /// Compare the candidates with the deployed model (if any) and pick one, or none.
    fn select(&mut self, deployed: Option<&Model>, candidates: &[Model]) -> Choice;
}

#[doc(hidden)]
pub struct Export<T>(PhantomData<T>);

impl<T: Selector> wit::Guest for Export<T> {
    fn configure(config: String) -> Result<(), String> {
        crate::state::set(T::configure(&config)?);
        Ok(())
    }

    fn select(deployed: Option<wit_types::Model>, candidates: Vec<wit_types::Model>) -> wit::Choice {
        let deployed = deployed.map(Model::from);
        let candidates: Vec<Model> = candidates.into_iter().map(Model::from).collect();
        let choice = crate::state::with(|policy: &mut T| policy.select(deployed.as_ref(), &candidates));
        wit::Choice {
            // An index that does not fit is out of range anyway; the host refuses it.
            deploy: choice.deploy.map(|index| u32::try_from(index).unwrap_or(u32::MAX)),
            reason: choice.reason,
        }
    }
}
