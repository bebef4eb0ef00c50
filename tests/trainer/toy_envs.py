"""Two learnable toy environments for trainer tests: the state names the best option."""

from alea_trl.envs import AleaEnv
from alea_trl.questions import Decision, Question


COLOURS = ("red", "blue", "green", "gold", "pink", "grey")


class NamedBestEnv(AleaEnv):
    """Dense: one decision; reward 1 for the option the state names, else 0. A report asks whether the named colour
    is red (readable from the text, so its loss can fall)."""

    name, dense = "named_best", True

    def __init__(self, n_options: int = 4):
        super().__init__()
        self.n_options = n_options

    def _reset(self, rng):
        self.options = [COLOURS[i] for i in rng.permutation(len(COLOURS))[: self.n_options]]
        self.best = int(rng.integers(self.n_options))

    def _observe(self):
        return Decision(
            f"The winning colour is {self.options[self.best]}.",
            [
                Question("act", "choice", "Which colour do you pick?", options=self.options, env=self.name),
                Question("red", "noul", "Is the winning colour red?", env=self.name),
            ],
            env=self.name,
        )

    def oracle_targets(self):
        return {"red": float(self.options[self.best] == "red")}

    def action_rewards(self):
        return [float(i == self.best) for i in range(self.n_options)]

    def oracle_action(self):
        return self.best

    def _step(self, action):
        return float(action == self.best), True


class ThreeInARowEnv(AleaEnv):
    """Outcome: ``n_rounds`` decisions (three by default); the return is 1 only if all of them pick the named option
    (chance 1/n^rounds). With ``immediate`` each right pick is rewarded at once instead (1/rounds a round), the same
    task with dense credit, to compare against."""

    name, dense = "three_in_a_row", False

    def __init__(self, n_options: int = 3, n_rounds: int = 3, immediate: bool = False):
        super().__init__()
        self.n_options, self.n_rounds, self.immediate = n_options, n_rounds, immediate

    def _reset(self, rng):
        self.options = [COLOURS[i] for i in rng.permutation(len(COLOURS))[: self.n_options]]
        self.best = int(rng.integers(self.n_options))
        self.t, self.hits = 0, 0

    def _observe(self):
        return Decision(
            f"The winning colour is {self.options[self.best]}. Round {self.t + 1} of {self.n_rounds}.",
            [Question("act", "choice", "Which colour do you pick?", options=self.options, env=self.name)],
            env=self.name,
        )

    def oracle_targets(self):
        return {}

    def oracle_action(self):
        return self.best

    def _step(self, action):
        self.hits += int(action == self.best)
        self.t += 1
        done = self.t == self.n_rounds
        if self.immediate:
            return float(action == self.best) / self.n_rounds, done
        return float(done and self.hits == self.n_rounds), done
