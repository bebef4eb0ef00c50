"""BibTeX entries the model card cites: GRPO, VinePPO (branching), TRL, and the proper scoring rule of each qtype."""

BIBTEX = {
    "grpo": """@article{shao2024deepseekmath,
  title   = {DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models},
  author  = {Shao, Zhihong and Wang, Peiyi and Zhu, Qihao and Xu, Runxin and Song, Junxiao and Bi, Xiao and
             Zhang, Haowei and Zhang, Mingchuan and Li, Y. K. and Wu, Y. and Guo, Daya},
  journal = {arXiv preprint arXiv:2402.03300},
  year    = {2024}
}""",
    "vineppo": """@article{kazemnejad2024vineppo,
  title   = {VinePPO: Unlocking RL Potential For LLM Reasoning Through Refined Credit Assignment},
  author  = {Kazemnejad, Amirhossein and Aghajohari, Milad and Portelance, Eva and Sordoni, Alessandro and
             Reddy, Siva and Courville, Aaron and Le Roux, Nicolas},
  journal = {arXiv preprint arXiv:2410.01679},
  year    = {2024}
}""",
    "proper": """@article{gneiting2007strictly,
  title   = {Strictly Proper Scoring Rules, Prediction, and Estimation},
  author  = {Gneiting, Tilmann and Raftery, Adrian E.},
  journal = {Journal of the American Statistical Association},
  volume  = {102}, number = {477}, pages = {359--378},
  year    = {2007}
}""",
    "choice": """@article{good1952rational,
  title   = {Rational Decisions},
  author  = {Good, I. J.},
  journal = {Journal of the Royal Statistical Society: Series B},
  volume  = {14}, number = {1}, pages = {107--114},
  year    = {1952}
}""",
    "score": """@article{epstein1969scoring,
  title   = {A Scoring System for Probability Forecasts of Ranked Categories},
  author  = {Epstein, Edward S.},
  journal = {Journal of Applied Meteorology},
  volume  = {8}, number = {6}, pages = {985--987},
  year    = {1969}
}""",
    "noul": """@article{brier1950verification,
  title   = {Verification of Forecasts Expressed in Terms of Probability},
  author  = {Brier, Glenn W.},
  journal = {Monthly Weather Review},
  volume  = {78}, number = {1}, pages = {1--3},
  year    = {1950}
}""",
    "regress": """@article{koenker1978regression,
  title   = {Regression Quantiles},
  author  = {Koenker, Roger and Bassett, Gilbert},
  journal = {Econometrica},
  volume  = {46}, number = {1}, pages = {33--50},
  year    = {1978}
}""",
    "trl": """@software{vonwerra2020trl,
  title  = {TRL: Transformers Reinforcement Learning},
  author = {von Werra, Leandro and Belkada, Younes and Tunstall, Lewis and Beeching, Edward and Thrush, Tristan and
            Lambert, Nathan and Huang, Shengyi and Rasul, Kashif and Gallou{\\'e}dec, Quentin},
  url    = {https://github.com/huggingface/trl},
  year   = {2020}
}""",
}


__all__ = ["BIBTEX"]
