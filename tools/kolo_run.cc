// placeholder replaced by the bootstrap work: kolo-run launcher
int main() { return 1; }
