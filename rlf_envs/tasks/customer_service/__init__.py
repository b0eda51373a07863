"""CustomerService: a tau-bench style shop with a simulated customer (``RLF/CustomerService-v0``).

Example:
    >>> from rlf_envs.tasks.customer_service import CustomerServiceTask, generate_shop
    >>> len(CustomerServiceTask(seed=0).instances("test")), len(generate_shop(0).users)
    (5, 30)
"""

from rlf_envs.tasks.customer_service.customer import scripted_customer
from rlf_envs.tasks.customer_service.data import Shop, generate_shop, write_shop
from rlf_envs.tasks.customer_service.scenarios import KINDS, Scenario, make_scenarios
from rlf_envs.tasks.customer_service.store import CANCEL_REASONS, StoreError, snapshot
from rlf_envs.tasks.customer_service.task import SYSTEM_PROMPT, CustomerServiceTask

__all__ = [
    "CANCEL_REASONS",
    "KINDS",
    "SYSTEM_PROMPT",
    "CustomerServiceTask",
    "Scenario",
    "Shop",
    "StoreError",
    "generate_shop",
    "make_scenarios",
    "scripted_customer",
    "snapshot",
    "write_shop",
]
