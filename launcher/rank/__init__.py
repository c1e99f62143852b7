"""What a rank does before its program starts (rank.sh), and installs before pretrain()."""
