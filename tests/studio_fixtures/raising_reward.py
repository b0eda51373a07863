"""A user reward file whose function raises: the studio must report it and save nothing."""


def reward(episode):
    return 1 / 0
