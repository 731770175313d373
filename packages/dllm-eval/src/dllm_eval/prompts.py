"""Prompt texts and row subsets of the published evaluation protocols (data, not code).

- d1 (dllm-reasoning/d1, commit 837888f): the instructions of ``eval/gsm8k.py``,
  ``eval/math500.py``, ``eval/countdown.py`` and ``eval/sudoku.py``, byte for byte (trailing
  spaces and MATH-500's stray ``"`` included), the question formats of their ``__getitem__``,
  and the 256 Sudoku rows ``eval/eval.py`` draws (``np.random.seed(42)`` then
  ``np.random.choice(500, 256, replace=False)``).
- OpenCompass as pinned by DARE (yjyddq/DARE, commit 83ae8a3,
  ``opencompass/opencompass/configs/datasets``): the 4-shot GSM8K prompt of
  ``gsm8k/gsm8k_gen_1d7fe4.py`` and the 0-shot MATH/AIME instruction of
  ``math/math_0shot_gen_11c4b5.py`` and ``aime2024/aime2024_gen_repeat8_6e39a4.py``.

Templates hold fields replaced literally (no ``str.format``, so braces in the text stay):
``{question}`` (the stored user prompt), ``{numbers}``
and ``{target}`` (Countdown), ``{puzzle}`` (Sudoku).
"""

from __future__ import annotations

__all__ = [
    "D1_COUNTDOWN_TEMPLATE",
    "D1_GSM8K_PROMPT",
    "D1_GSM8K_TEMPLATE",
    "D1_MATH500_PROMPT",
    "D1_MATH500_TEMPLATE",
    "D1_SUDOKU_ROWS",
    "D1_SUDOKU_TEMPLATE",
    "OC_GSM8K_SHOTS",
    "OC_GSM8K_TEMPLATE",
    "OC_MATH_TEMPLATE",
]

_D1_FORMAT = (
    "Respond in the following format:\n<reasoning>\nYour reasoning here\n</reasoning>\n"
    "<answer>\n\\boxed{...}\n</answer>"
)
D1_GSM8K_PROMPT = (
    "You are a math expert. You will be given a question to solve. Solve it step by step. "
    "Wrap the final answer in a \\boxed{}. \n" + _D1_FORMAT
)
"""d1 ``GSM_SYSTEM_PROMPT`` (note the space before the first newline)."""
D1_MATH500_PROMPT = (
    "You are a math expert. You will be given a question to solve. Solve it step by step. "
    "Wrap the final answer in a \\boxed{}.\n" + _D1_FORMAT + "\" \n"
)
"""d1 ``MATH500_SYSTEM_PROMPT`` (no space before the first newline; ends with ``"`` and a space)."""
_D1_COUNTDOWN_PROMPT = (
    "Using only the provided numbers, create an arithmetic expression that evaluates to exactly "
    "the provided target number. You may use the operations +, -, *, and / as needed, but each "
    "number must be used exactly once. Think step-by-step. After reasoning, provide only your "
    "final expression inside \\boxed{} tags without including an equals sign or the target "
    "number. For example: \\boxed{a + b * c}" + _D1_FORMAT
)
_D1_SUDOKU_PROMPT = (
    "\nPlease solve the following 4x4 Sudoku puzzle. The puzzle is provided as a 16-character "
    "string reading left-to-right, top-to-bottom, where '0' represents empty cells.\n\n"
    "Rules:\n- Fill empty cells with digits 1-4\n- Each row must contain digits 1-4 exactly "
    "once\n- Each column must contain digits 1-4 exactly once\n- Each 2x2 box must contain "
    "digits 1-4 exactly once\n\nImportant: Your solution must be a COMPLETE 16-character "
    "string with only the digits 1-4, representing your final solved grid.\n\n"
    "Respond in this exact format:\n<reasoning>\nYour step-by-step solving process\n"
    "</reasoning>\n<answer>\n[16-character solution string with no spaces or separators]\n"
    "</answer>\n"
)
D1_GSM8K_TEMPLATE = D1_GSM8K_PROMPT + "\n\n{question}"
D1_MATH500_TEMPLATE = D1_MATH500_PROMPT + "\n\n{question}"
D1_COUNTDOWN_TEMPLATE = _D1_COUNTDOWN_PROMPT + "\n\nNumbers: {numbers}\nTarget: {target}"
D1_SUDOKU_TEMPLATE = _D1_SUDOKU_PROMPT + "\n\nSolve the following Sudoku puzzle: {puzzle}\n"

D1_SUDOKU_ROWS: tuple[int, ...] = (
    361, 73, 374, 155, 104, 394, 377, 124, 68, 450, 9, 194, 406, 84, 371, 388, 495, 30, 316,
    408, 490, 491, 280, 356, 76, 461, 497, 211, 101, 334, 475, 336, 440, 173, 2, 333, 409,
    70, 209, 63, 384, 93, 485, 185, 33, 77, 0, 11, 415, 22, 72, 182, 131, 410, 193, 55, 148,
    18, 204, 78, 494, 262, 323, 483, 79, 39, 451, 46, 238, 391, 352, 341, 277, 290, 317,
    304, 268, 69, 455, 465, 154, 82, 477, 172, 321, 90, 180, 414, 312, 278, 381, 472, 362,
    324, 431, 347, 86, 75, 438, 15, 249, 433, 19, 322, 332, 56, 301, 229, 331, 132, 137,
    423, 335, 25, 464, 281, 247, 237, 117, 42, 220, 176, 320, 153, 231, 227, 417, 203, 126,
    329, 31, 113, 470, 271, 140, 57, 192, 24, 17, 265, 66, 208, 479, 94, 253, 266, 23, 222,
    261, 426, 5, 116, 45, 16, 462, 357, 3, 218, 405, 60, 110, 318, 428, 29, 437, 471, 26, 7,
    453, 108, 37, 157, 489, 118, 114, 175, 373, 181, 144, 369, 390, 195, 404, 275, 454, 141,
    365, 67, 210, 168, 493, 375, 400, 272, 109, 248, 145, 92, 152, 367, 467, 83, 245, 165,
    163, 199, 228, 74, 478, 358, 250, 119, 310, 299, 255, 354, 399, 225, 353, 234, 382, 274,
    36, 196, 139, 364, 244, 439, 286, 59, 111, 89, 436, 6, 360, 346, 338, 158, 150, 177,
    393, 184, 449, 10, 380, 103, 81, 38, 314, 167, 469, 296, 474, 198, 297, 416
)
"""Rows of the 500-row Sudoku test set d1 evaluates, in d1's order."""

OC_GSM8K_TEMPLATE = "Question: {question}\nLet's think step by step\nAnswer:"
OC_MATH_TEMPLATE = (
    "{question}\nPlease reason step by step, and put your final answer within \\boxed{}."
)
OC_GSM8K_SHOTS: tuple[dict[str, str], ...] = (
    {"role": "user", "content": (
        'Question: Angelo and Melanie want to plan how many hours over the next week they should study together for their test next week. They have 2 chapters of their textbook to study and 4 worksheets to memorize. They figure out that they should dedicate 3 hours to each chapter of their textbook and 1.5 hours for each worksheet. If they plan to study no more than 4 hours each day, how many days should they plan to study total over the next week if they take a 10-minute break every hour, include 3 10-minute snack breaks each day, and 30 minutes for lunch each day?\n'
        "Let's think step by step\n"
        'Answer:'
    )},
    {"role": "assistant", "content": (
        'Angelo and Melanie think they should dedicate 3 hours to each of the 2 chapters, 3 hours x 2 chapters = 6 hours total.\n'
        'For the worksheets they plan to dedicate 1.5 hours for each worksheet, 1.5 hours x 4 worksheets = 6 hours total.\n'
        'Angelo and Melanie need to start with planning 12 hours to study, at 4 hours a day, 12 / 4 = 3 days.\n'
        'However, they need to include time for breaks and lunch. Every hour they want to include a 10-minute break, so 12 total hours x 10 minutes = 120 extra minutes for breaks.\n'
        'They also want to include 3 10-minute snack breaks, 3 x 10 minutes = 30 minutes.\n'
        'And they want to include 30 minutes for lunch each day, so 120 minutes for breaks + 30 minutes for snack breaks + 30 minutes for lunch = 180 minutes, or 180 / 60 minutes per hour = 3 extra hours.\n'
        'So Angelo and Melanie want to plan 12 hours to study + 3 hours of breaks = 15 hours total.\n'
        'They want to study no more than 4 hours each day, 15 hours / 4 hours each day = 3.75\n'
        'They will need to plan to study 4 days to allow for all the time they need.\n'
        'The answer is 4\n'
    )},
    {"role": "user", "content": (
        "Question: Mark's basketball team scores 25 2 pointers, 8 3 pointers and 10 free throws.  Their opponents score double the 2 pointers but half the 3 pointers and free throws.  What's the total number of points scored by both teams added together?\n"
        "Let's think step by step\n"
        'Answer:'
    )},
    {"role": "assistant", "content": (
        "Mark's team scores 25 2 pointers, meaning they scored 25*2= 50 points in 2 pointers.\n"
        'His team also scores 6 3 pointers, meaning they scored 8*3= 24 points in 3 pointers\n'
        'They scored 10 free throws, and free throws count as one point so they scored 10*1=10 points in free throws.\n'
        'All together his team scored 50+24+10= 84 points\n'
        "Mark's opponents scored double his team's number of 2 pointers, meaning they scored 50*2=100 points in 2 pointers.\n"
        "His opponents scored half his team's number of 3 pointers, meaning they scored 24/2= 12 points in 3 pointers.\n"
        "They also scored half Mark's team's points in free throws, meaning they scored 10/2=5 points in free throws.\n"
        "All together Mark's opponents scored 100+12+5=117 points\n"
        "The total score for the game is both team's scores added together, so it is 84+117=201 points\n"
        'The answer is 201\n'
    )},
    {"role": "user", "content": (
        'Question: Bella has two times as many marbles as frisbees. She also has 20 more frisbees than deck cards. If she buys 2/5 times more of each item, what would be the total number of the items she will have if she currently has 60 marbles?\n'
        "Let's think step by step\n"
        'Answer:'
    )},
    {"role": "assistant", "content": (
        "When Bella buys 2/5 times more marbles, she'll have increased the number of marbles by 2/5*60 = 24\n"
        "The total number of marbles she'll have is 60+24 = 84\n"
        'If Bella currently has 60 marbles, and she has two times as many marbles as frisbees, she has 60/2 = 30 frisbees.\n'
        "If Bella buys 2/5 times more frisbees, she'll have 2/5*30 = 12 more frisbees.\n"
        "The total number of frisbees she'll have will increase to 30+12 = 42\n"
        'Bella also has 20 more frisbees than deck cards, meaning she has 30-20 = 10 deck cards\n'
        "If she buys 2/5 times more deck cards, she'll have 2/5*10 = 4 more deck cards.\n"
        "The total number of deck cards she'll have is 10+4 = 14\n"
        'Together, Bella will have a total of 14+42+84 = 140 items\n'
        'The answer is 140\n'
    )},
    {"role": "user", "content": (
        'Question: A group of 4 fruit baskets contains 9 apples, 15 oranges, and 14 bananas in the first three baskets and 2 less of each fruit in the fourth basket. How many fruits are there?\n'
        "Let's think step by step\n"
        'Answer:'
    )},
    {"role": "assistant", "content": (
        'For the first three baskets, the number of apples and oranges in one basket is 9+15=24\n'
        'In total, together with bananas, the number of fruits in one basket is 24+14=38 for the first three baskets.\n'
        'Since there are three baskets each having 38 fruits, there are 3*38=114 fruits in the first three baskets.\n'
        'The number of apples in the fourth basket is 9-2=7\n'
        'There are also 15-2=13 oranges in the fourth basket\n'
        'The combined number of oranges and apples in the fourth basket is 13+7=20\n'
        'The fourth basket also contains 14-2=12 bananas.\n'
        'In total, the fourth basket has 20+12=32 fruits.\n'
        'The four baskets together have 32+114=146 fruits.\n'
        'The answer is 146\n'
    )},
)
"""The four worked examples (user/assistant turns) of OpenCompass's ``gsm8k_gen_1d7fe4``."""
