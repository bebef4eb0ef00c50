"""Any Gymnasium env with a ``Discrete`` action space as an Alea env, with exact oracles where the env has a model.

Design decisions:
1. The adapter steps the Gymnasium env itself (``step``, every wrapper included): rewards, endings and randomness are
   the env's own. Each episode starts with ``reset(seed=...)``, the seed drawn from the generator given to
   ``reset(rng)``, so a seed replays an episode; a deep copy or a pickle carries the env's generator and continues
   identically.
2. Model: Gymnasium's transition table (``unwrapped.P`` with ``initial_state_distrib``: FrozenLake, Taxi,
   CliffWalking, or a user's env that has them) or Blackjack's exact model. With one, the env is dense:
   ``action_rewards()`` is ``Q*(s, .)`` (the discounted value of each action followed by optimal play until the
   horizon), ``oracle_action()`` its argmax (lowest index on ties) and two reports come from the model: the
   probability that optimal play reaches the goal (noul) and the expected steps left (regress). Without a model the
   env runs in outcome mode: only the episode return is revealed.
3. The horizon is the env's time limit (``TimeLimit``) unless given; the oracle depends on the steps left, so the state
   text states them (and the discount when it is not 1). A horizon above the env's own time limit is refused. The
   discount is the oracle's: outcome mode (no oracle) refuses one below 1 rather than print it and sum undiscounted.
4. The state text comes from ``render(obs, env)``: a user function, or a built-in rendering of the Gymnasium class
   (``renderings.TOY_TEXT``; by name, so a YAML config can pick one); action names from ``action_names``, the
   built-in table, or ``action 0``, ``action 1``.
5. Solved models are cached per Gymnasium id and settings, so the many copies of an env in an episode pool solve once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gymnasium
import numpy as np

from ...questions import ACT_QID, Decision, Question
from ..base import AleaEnv, exact_decimal
from .renderings import TOY_TEXT, exact_text, table_model
from .tabular import Solution, TabularModel, solve


_SOLVED: dict[tuple, tuple[TabularModel, Solution]] = {}
STEPS_QUESTION = (
    "How many steps will the rest of the episode last, this one included, if you play optimally from here?"
)


def _time_limit(env) -> int | None:
    """The ``max_episode_steps`` of the outermost ``TimeLimit`` wrapper, if any."""
    while env is not None:
        if isinstance(env, gymnasium.wrappers.TimeLimit):
            return int(env._max_episode_steps)
        env = getattr(env, "env", None)
    return None


def _default_text(obs, env) -> str:
    return f"Observation: {obs}."


class GymnasiumEnv(AleaEnv):
    """A Gymnasium env as an Alea env.

    Description:
        Wraps an env whose action space is ``Discrete``. Its reward, endings and randomness are its own; the text the
        model reads comes from a rendering of each observation.

    Actions:
        The env's actions, named by ``action_names`` (FrozenLake: left, down, right, up; Taxi: south, north, east,
        west, pickup, dropoff; CliffWalking: up, right, down, left; Blackjack: stick, hit).

    State text:
        The steps left when there is a horizon and the discount when it is not 1, then ``render(obs, env)``.

    Questions:
        - ``act`` (choice): the action.
        - ``goal`` (noul, with a model that has a goal): the probability that optimal play reaches the goal.
        - ``steps_left`` (regress, with a model): the expected steps left under optimal play, this one included.

    Rewards:
        The env's own; with a model ``action_rewards()`` is ``Q*(s, .)``, a return-to-go
        (``action_rewards_to_go = True``): a trainer logs the episode's realised return, not a sum of them.

    Episode end:
        When the env terminates or truncates, or after ``horizon`` steps.

    Oracle:
        Backward induction over the horizon (value iteration to a fixed point without one) on the model:
        ``alea_trl.envs.gymnasium.tabular.solve``.

    Arguments:
        env (`str`, `gymnasium.Env` or `Callable`): a Gymnasium id (made with ``gym_kwargs``), an env, or a
            zero-argument factory of one.
        name (`str`, *optional*): the env's name (default ``gym-<id>``).
        render (`Callable` or `str`, *optional*): ``render(obs, env) -> str``, or the name of a built-in rendering
            of the Gymnasium class (``"default"``; Taxi also ``"short"``: no map, about a third of the tokens);
            default: the built-in rendering of the Gymnasium class, else ``"Observation: <obs>."``.
        action_names (`Sequence[str]`, *optional*): one distinct name per action.
        model (`bool` or `TabularModel`, defaults to `True`): use the env's model (``unwrapped.P``, or Blackjack's)
            when it has one; `False` runs outcome mode; a `TabularModel` supplies one (its states are
            ``state(obs, env)``, by default the observation itself).
        state (`Callable`, *optional*): ``state(obs, env) -> int``, the model state of an observation.
        goal (`Callable`, *optional*): ``goal(next_state, reward, terminated) -> bool`` marks the model outcomes that
            reach the goal (built in for the toy-text envs); without one no goal question is asked.
        goal_question (`str`, *optional*): the goal question's text.
        discount (`float`, defaults to 1.0): discount of the oracle's values (``Q*``), in (0, 1], at most 4
            decimals. Only with a model: an outcome-mode env refuses a discount below 1, since its returns are summed
            undiscounted by training and evaluation alike (the episode return is the one objective of every outcome
            env) and the discount would only change the text.
        horizon (`int`, *optional*): steps per episode; default the env's time limit.
        gym_kwargs (`dict`, *optional*): keyword arguments of ``gymnasium.make`` when ``env`` is an id.
        oracle_policy (`Callable`, *optional*): outcome mode: ``oracle_policy(env) -> int``, the best known policy.
    """

    action_rewards_to_go = True  # Q*(s, a): this step's reward and every later one's under optimal play

    def __init__(
        self,
        env: str | gymnasium.Env | Callable,
        name: str | None = None,
        render: Callable | str | None = None,
        action_names: Sequence[str] | None = None,
        model: bool | TabularModel = True,
        state: Callable | None = None,
        goal: Callable | None = None,
        goal_question: str | None = None,
        discount: float = 1.0,
        horizon: int | None = None,
        gym_kwargs: dict | None = None,
        oracle_policy: Callable | None = None,
    ):
        super().__init__()
        gym_id = env if isinstance(env, str) else None
        self.name = name or f"gym-{gym_id or type(getattr(env, 'unwrapped', env)).__name__}"
        gym_kwargs = dict(gym_kwargs or {})
        if horizon is not None and (
            isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1
        ):
            raise ValueError(f"env {self.name!r}: field 'horizon': must be a positive integer, got {horizon!r}")
        if gym_kwargs and gym_id is None:
            raise ValueError(f"env {self.name!r}: field 'gym_kwargs': only used with a Gymnasium id, got an env")
        if gym_id is not None and horizon is not None:
            gym_kwargs.setdefault("max_episode_steps", int(horizon))
        try:
            self.gym_env = gymnasium.make(gym_id, **gym_kwargs) if gym_id is not None else env
            if not isinstance(self.gym_env, gymnasium.Env) and callable(self.gym_env):
                self.gym_env = self.gym_env()
        except (TypeError, ValueError, gymnasium.error.Error) as err:
            raise ValueError(
                f"env {self.name!r}: field 'gym_kwargs': gymnasium.make({gym_id!r}) failed: {err}"
            ) from err
        if not isinstance(self.gym_env, gymnasium.Env):
            raise ValueError(f"env {self.name!r}: field 'env': not a Gymnasium env: {self.gym_env!r}")
        space = self.gym_env.action_space
        if not isinstance(space, gymnasium.spaces.Discrete):
            raise ValueError(f"env {self.name!r}: field 'env': the action space must be Discrete, got {space}")
        self.unwrapped = self.gym_env.unwrapped
        spec = TOY_TEXT.get(type(self.unwrapped).__name__)
        self.n_actions, self._action_start = int(space.n), int(space.start)
        names = tuple(action_names or (spec.actions if spec else [f"action {i}" for i in range(self.n_actions)]))
        if len(names) != self.n_actions:
            raise ValueError(f"env {self.name!r}: field 'action_names': need {self.n_actions} names, got {len(names)}")
        self.action_names = names
        if isinstance(render, str):  # a built-in rendering by name (YAML and --env_kwargs cannot pass a function)
            named = spec.named_renderings() if spec else {"default": _default_text}
            if render not in named:
                raise ValueError(
                    f"env {self.name!r}: field 'render': {render!r} is not a built-in rendering of "
                    f"{type(self.unwrapped).__name__} (built in: {', '.join(map(repr, named))}); pass a "
                    "function render(obs, env) -> str"
                )
            render = named[render]
        self.render = render or (spec.render if spec else _default_text)
        self.state_of = state or (spec.state if spec and spec.state else None)
        self.discount = exact_decimal(self.name, "discount", discount, 4)
        if not 0.0 < self.discount <= 1.0:
            raise ValueError(f"env {self.name!r}: field 'discount': must be in (0, 1], got {discount!r}")
        limit = _time_limit(self.gym_env)
        if horizon is not None and limit is not None and horizon > limit:
            raise ValueError(f"env {self.name!r}: field 'horizon': {horizon} exceeds the env's time limit {limit}")
        self.horizon = int(horizon) if horizon is not None else limit
        self.goal_question = goal_question or (spec.goal_question if spec else None)
        self.oracle_policy = oracle_policy
        self.model, self.solution = self._solve(model, spec, goal, gym_id, gym_kwargs)
        # the built-in goal test of the toy-text envs, for the share of episodes that reach their goal (Blackjack's
        # spec has none: its return already says how often a hand is won); looked up at each episode end, not kept,
        # so the env stays picklable (checkpoints pickle it)
        self._has_goal = bool(spec) and spec.goal(self.unwrapped) is not None
        self.dense = self.solution is not None
        if not self.dense and self.discount != 1.0:
            raise ValueError(
                f"env {self.name!r}: field 'discount': {discount!r} discounts the model's oracle values, and this env "
                "runs in outcome mode (no model): it would only change the state text, since training (branch "
                "values, reward-to-go, episode returns) and evaluation sum its rewards undiscounted, as for every "
                "outcome env; pass discount=1.0, or a model"
            )
        self.t, self.obs = 0, None

    def _solve(self, model, spec, goal, gym_id, gym_kwargs):
        """The model (given, built in, or the env's table) and its solution; ``(None, None)`` for outcome mode."""
        if model is False:
            return None, None
        key = None
        if not isinstance(model, TabularModel):
            has_table = hasattr(self.unwrapped, "P") and hasattr(self.unwrapped, "initial_state_distrib")
            build = spec.model if spec and spec.model else table_model if has_table else None
            if build is None:
                return None, None  # no model: outcome mode
            if getattr(self.unwrapped, "fickle_passenger", False):
                raise ValueError(
                    f"env {self.name!r}: field 'fickle_passenger': Taxi's transition table does not model a fickle "
                    "passenger, so its oracle would be wrong; pass model=False to run it in outcome mode"
                )
            if gym_id is not None and goal is None:  # the model follows from the id and its settings alone
                key = (gym_id, repr(sorted(gym_kwargs.items())), self.discount, self.horizon)
                if key in _SOLVED:
                    return _SOLVED[key]
            model = build(self.unwrapped, goal or (spec.goal(self.unwrapped) if spec else None))
        if model.n_actions != self.n_actions:
            raise ValueError(
                f"env {self.name!r}: field 'model': {model.n_actions} actions, the env has {self.n_actions}"
            )
        solved = (model, solve(model, self.discount, self.horizon, env=self.name))
        if key is not None:
            _SOLVED[key] = solved
        return solved

    # ------------------------------------------------------------------------------------------------------ episode
    def _reset(self, rng: np.random.Generator) -> None:
        self.obs, _ = self.gym_env.reset(seed=int(rng.integers(2**31 - 1)))
        self.t = 0
        self.reached_goal = False if self._has_goal else None

    def _step(self, action: int) -> tuple[float, bool]:
        self.obs, reward, terminated, truncated, _ = self.gym_env.step(self._action_start + action)
        self.t += 1
        if self._has_goal and terminated:
            goal = TOY_TEXT[type(self.unwrapped).__name__].goal(self.unwrapped)
            state = self.state_of(self.obs, self) if self.state_of else self.obs
            self.reached_goal = bool(goal(int(state), float(reward), True))
        return float(reward), bool(terminated or truncated or (self.horizon is not None and self.t >= self.horizon))

    def n_legal(self) -> int:
        return self.n_actions

    @property
    def steps_left(self) -> int | None:
        """Steps left before the horizon cuts the episode (``None`` without a horizon)."""
        return None if self.horizon is None else self.horizon - self.t

    # -------------------------------------------------------------------------------------------------- observation
    def _observe(self) -> Decision:
        rendered = self.render(self.obs, self)
        if not isinstance(rendered, str) or not rendered:
            raise ValueError(f"env {self.name!r}: field 'render': must return a non-empty string, got {rendered!r}")
        text = ""  # the episode's clock first: the rendering ends with the state, next to the questions
        if self.horizon is not None:
            left = self.steps_left
            text += f"{left} step{'s' * (left != 1)} left in the episode, this one included. "
        if self.discount != 1.0:
            text += f"Rewards are discounted by {exact_text(self.discount, self.name, 'discount')} a step. "
        text += rendered
        questions = [
            Question(ACT_QID, "choice", "Which action do you take?", options=self.action_names, env=self.name)
        ]
        if self.solution is not None:
            if self.model.goal.any():
                questions.append(
                    Question(
                        "goal",
                        "noul",
                        self.goal_question
                        or "What is the probability that you reach the goal, if you play optimally from here?",
                        env=self.name,
                    )
                )
            questions.append(Question("steps_left", "regress", STEPS_QUESTION, env=self.name))
        return Decision(text, questions, env=self.name)

    # ------------------------------------------------------------------------------------------------------- oracle
    def model_state(self) -> int:
        """The model's state of the current observation."""
        s = self.state_of(self.obs, self) if self.state_of else self.obs
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 0 <= int(s) < self.model.n_states:
            raise ValueError(f"env {self.name!r}: field 'state': {s!r} is not a state of the model")
        return int(s)

    def oracle_targets(self) -> dict:
        self._check_live("oracle_targets")
        if self.solution is None:
            return {}
        s, t = self.model_state(), self.solution.at(self.t)
        targets = {"steps_left": float(self.solution.steps_left[t, s])}
        if self.model.goal.any():
            targets["goal"] = float(min(1.0, max(0.0, self.solution.goal_prob[t, s])))
        return targets

    def action_rewards(self) -> list[float] | None:
        if self.solution is None:
            return None
        self._check_live("action_rewards")
        return self.solution.values(self.t, self.model_state()).tolist()

    def oracle_action(self) -> int:
        self._check_live("oracle_action")
        if self.solution is not None:
            return self.solution.action(self.t, self.model_state())
        if self.oracle_policy is None:
            raise NotImplementedError(
                f"env {self.name!r}: no model, so no oracle; pass oracle_policy=(env -> action) for the evaluation"
            )
        return int(self.oracle_policy(self))

    def initial_value(self) -> float:
        """``E[V*(s0)]``: the optimal expected (discounted) return over the env's first states."""
        if self.solution is None:
            raise ValueError(f"env {self.name!r}: field 'model': no model, so no optimal value")
        return self.solution.initial_value(self.model)


__all__ = ["GymnasiumEnv"]
