"""The strategy site.yml runs with (ansible.cfg): Ansible's linear strategy through Mitogen where Mitogen is installed.

Mitogen (a dependency of clustercheck) keeps one Python interpreter per node for the whole run and sends each module to
it, instead of one SSH command, one sudo and one new Python importing Ansible's module code for every task on every
node: a site.yml run that changes nothing took about half the CPU time and two thirds of the time on three nodes
(docs/benchmarks.md, "Mitogen"). The tasks, their order and their results are the linear strategy's.

Where Mitogen is not installed (an Ansible of its own, without clustercheck's dependencies), the plain linear strategy
runs, with a warning that says so. ANSIBLE_STRATEGY=linear runs without Mitogen on purpose.
"""

from __future__ import annotations

from ansible.plugins.loader import strategy_loader
from ansible.utils.display import Display

try:
    import ansible_mitogen.loaders  # Mitogen's plugin loaders, imported before its strategy
    import ansible_mitogen.strategy
except ImportError:
    ansible_mitogen = None

_Linear = strategy_loader.get("linear", class_only=True)

if ansible_mitogen is not None:

    class StrategyModule(ansible_mitogen.strategy.StrategyMixin, _Linear):
        pass

else:

    class StrategyModule(_Linear):
        def __init__(self, tqm):
            super().__init__(tqm)
            Display().warning(
                "Mitogen is not installed with this Ansible (pip install mitogen): running Ansible's linear strategy, "
                "which is slower (ANSIBLE_STRATEGY=linear chooses it without this warning)"
            )
